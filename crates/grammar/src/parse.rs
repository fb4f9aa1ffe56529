//! GBNF text to a syntax tree, following the syntax llama.cpp documents in
//! <https://github.com/ggml-org/llama.cpp/blob/master/grammars/README.md>.
//!
//! A rule runs until the next `name ::=`, so rules may span lines freely; `#` starts a
//! comment that runs to the end of the line.

use crate::charset::{CharSet, MAX_CHAR};
use crate::error::{GrammarError, GrammarErrorKind};

/// Largest `{m,n}` bound accepted: each repetition is expanded into rules.
pub const MAX_REPEAT: u32 = 10_000;

#[derive(Debug, Clone)]
pub(crate) struct RuleDef {
    pub name: String,
    pub pos: (usize, usize),
    pub alts: Vec<Vec<Item>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub atom: Atom,
    pub min: u32,
    /// `None`: unbounded.
    pub max: Option<u32>,
    pub pos: (usize, usize),
}

#[derive(Debug, Clone)]
pub(crate) enum Atom {
    Literal(Vec<u32>),
    Chars(CharSet),
    Ref(String),
    Group(Vec<Vec<Item>>),
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    line: usize,
    column: usize,
}

type Result<T> = std::result::Result<T, GrammarError>;

pub(crate) fn parse(src: &str) -> Result<Vec<RuleDef>> {
    let mut p = Parser {
        chars: src.chars().collect(),
        at: 0,
        line: 1,
        column: 1,
    };
    let mut rules = Vec::new();
    p.skip_space();
    while p.peek().is_some() {
        let pos = p.pos();
        let name = p.name()?;
        p.skip_space();
        p.expect_str("::=")?;
        let alts = p.alternatives(false)?;
        rules.push(RuleDef { name, pos, alts });
        p.skip_space();
    }
    Ok(rules)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn pos(&self) -> (usize, usize) {
        (self.line, self.column)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn err_at(&self, pos: (usize, usize), kind: GrammarErrorKind) -> GrammarError {
        GrammarError {
            line: pos.0,
            column: pos.1,
            kind,
        }
    }

    fn expected(&self, expected: &'static str) -> GrammarError {
        let found = match self.peek() {
            Some(c) => format!("{c:?}"),
            None => "end of input".to_string(),
        };
        self.err_at(self.pos(), GrammarErrorKind::Expected { expected, found })
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while let Some(c) = self.peek() {
                    if c == '\n' {
                        break;
                    }
                    self.bump();
                }
            } else if c.is_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    fn expect_str(&mut self, s: &'static str) -> Result<()> {
        for (i, want) in s.chars().enumerate() {
            if self.chars.get(self.at + i) != Some(&want) {
                return Err(self.expected(s));
            }
        }
        for _ in s.chars() {
            self.bump();
        }
        Ok(())
    }

    fn name(&mut self) -> Result<String> {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|&c| is_name_char(c)) {
            name.push(c);
            self.bump();
        }
        if name.is_empty() {
            return Err(self.expected("a rule name"));
        }
        Ok(name)
    }

    /// True when the input at the cursor is `name ::=`: the start of the next rule.
    fn at_rule_start(&self) -> bool {
        let mut i = self.at;
        while self.chars.get(i).is_some_and(|&c| is_name_char(c)) {
            i += 1;
        }
        if i == self.at {
            return false;
        }
        while self.chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        self.chars
            .get(i..i + 3)
            .is_some_and(|s| s == [':', ':', '='])
    }

    fn alternatives(&mut self, in_group: bool) -> Result<Vec<Vec<Item>>> {
        let mut alts = vec![self.sequence(in_group)?];
        while self.peek() == Some('|') {
            self.bump();
            alts.push(self.sequence(in_group)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, in_group: bool) -> Result<Vec<Item>> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            let pos = self.pos();
            let atom = match self.peek() {
                None | Some('|') => break,
                Some(')') if in_group => break,
                Some('"') => Atom::Literal(self.literal()?),
                Some('[') => Atom::Chars(self.class()?),
                Some('.') => {
                    self.bump();
                    Atom::Chars(CharSet::any())
                }
                Some('(') => {
                    self.bump();
                    let alts = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.expected("`)`"));
                    }
                    self.bump();
                    Atom::Group(alts)
                }
                Some(c) if is_name_char(c) => {
                    if self.at_rule_start() {
                        break;
                    }
                    Atom::Ref(self.name()?)
                }
                Some(_) => return Err(self.expected("a literal, class, rule name or `(`")),
            };
            let (min, max) = self.repetition()?;
            items.push(Item {
                atom,
                min,
                max,
                pos,
            });
        }
        Ok(items)
    }

    fn repetition(&mut self) -> Result<(u32, Option<u32>)> {
        match self.peek() {
            Some('*') => {
                self.bump();
                Ok((0, None))
            }
            Some('+') => {
                self.bump();
                Ok((1, None))
            }
            Some('?') => {
                self.bump();
                Ok((0, Some(1)))
            }
            Some('{') => {
                let pos = self.pos();
                self.bump();
                self.skip_space();
                let min = self.number(pos)?;
                self.skip_space();
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.bump();
                        self.skip_space();
                        if self.peek() == Some('}') {
                            None
                        } else {
                            let max = self.number(pos)?;
                            self.skip_space();
                            Some(max)
                        }
                    }
                    _ => return Err(self.expected("`,` or `}`")),
                };
                if self.peek() != Some('}') {
                    return Err(self.expected("`}`"));
                }
                self.bump();
                if let Some(max) = max {
                    if max < min {
                        let msg = format!("maximum {max} is below minimum {min}");
                        return Err(self.err_at(pos, GrammarErrorKind::BadRepetition(msg)));
                    }
                }
                if max.unwrap_or(min) > MAX_REPEAT {
                    let msg = format!("bounds above {MAX_REPEAT} are not supported");
                    return Err(self.err_at(pos, GrammarErrorKind::BadRepetition(msg)));
                }
                Ok((min, max))
            }
            _ => Ok((1, Some(1))),
        }
    }

    fn number(&mut self, brace: (usize, usize)) -> Result<u32> {
        let mut digits = String::new();
        while let Some(c) = self.peek().filter(char::is_ascii_digit) {
            digits.push(c);
            self.bump();
        }
        if digits.is_empty() {
            return Err(self.expected("a number"));
        }
        digits.parse().map_err(|_| {
            let msg = format!("{digits} is too large");
            self.err_at(brace, GrammarErrorKind::BadRepetition(msg))
        })
    }

    fn literal(&mut self) -> Result<Vec<u32>> {
        let start = self.pos();
        self.bump();
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None | Some('\n') => {
                    return Err(self.err_at(start, GrammarErrorKind::UnterminatedLiteral))
                }
                Some('"') => {
                    self.bump();
                    return Ok(out);
                }
                Some('\\') => out.push(self.escape()?),
                Some(c) => {
                    self.bump();
                    out.push(c as u32);
                }
            }
        }
    }

    fn class(&mut self) -> Result<CharSet> {
        let start = self.pos();
        self.bump();
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.peek() {
                None | Some('\n') => {
                    return Err(self.err_at(start, GrammarErrorKind::UnterminatedClass))
                }
                Some(']') => {
                    self.bump();
                    break;
                }
                Some(_) => self.class_char()?,
            };
            let is_range =
                self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|&c| c != ']');
            if is_range {
                let pos = self.pos();
                self.bump();
                if matches!(self.peek(), None | Some('\n')) {
                    return Err(self.err_at(start, GrammarErrorKind::UnterminatedClass));
                }
                let hi = self.class_char()?;
                if hi < lo {
                    let kind = GrammarErrorKind::EmptyRange {
                        lo: char::from_u32(lo).unwrap_or('\u{FFFD}'),
                        hi: char::from_u32(hi).unwrap_or('\u{FFFD}'),
                    };
                    return Err(self.err_at(pos, kind));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        let set = CharSet::from_ranges(ranges);
        Ok(if negated { set.complement() } else { set })
    }

    fn class_char(&mut self) -> Result<u32> {
        if self.peek() == Some('\\') {
            self.escape()
        } else {
            Ok(self.bump().map_or(0, |c| c as u32))
        }
    }

    fn escape(&mut self) -> Result<u32> {
        let pos = self.pos();
        self.bump();
        let c = self.bump().ok_or_else(|| {
            self.err_at(
                pos,
                GrammarErrorKind::BadEscape("`\\` at end of input".into()),
            )
        })?;
        let digits = match c {
            'n' => return Ok('\n' as u32),
            't' => return Ok('\t' as u32),
            'r' => return Ok('\r' as u32),
            '\\' | '"' | '[' | ']' | '-' | '^' => return Ok(c as u32),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            other => {
                let msg = format!("unknown escape `\\{other}`");
                return Err(self.err_at(pos, GrammarErrorKind::BadEscape(msg)));
            }
        };
        let mut value = 0u32;
        for _ in 0..digits {
            let d = self.peek().and_then(|c| c.to_digit(16)).ok_or_else(|| {
                let msg = format!("`\\{c}` needs {digits} hex digits");
                self.err_at(pos, GrammarErrorKind::BadEscape(msg))
            })?;
            self.bump();
            value = value << 4 | d;
        }
        if value > MAX_CHAR || (0xD800..=0xDFFF).contains(&value) {
            let msg = format!("U+{value:X} is not a Unicode scalar value");
            return Err(self.err_at(pos, GrammarErrorKind::BadEscape(msg)));
        }
        Ok(value)
    }
}
