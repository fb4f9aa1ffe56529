//! Lowering the GBNF syntax tree to [`CompiledGrammar`]: groups and repetitions become
//! generated rules, names become indices, and left recursion is refused.

use std::collections::HashMap;

use crate::charset::CharSet;
use crate::error::{GrammarError, GrammarErrorKind};
use crate::parse::{parse, Atom, Item, RuleDef};

/// Cap on the lowered grammar's size, so that nested `{m,n}` cannot exhaust memory.
const MAX_ELEMS: usize = 2_000_000;

/// One element of a flattened alternative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    /// Match one code point from `CompiledGrammar::charsets[i]`.
    Chars(u32),
    /// Match rule `i`.
    Ref(u32),
    /// End of an alternative.
    End,
}

/// A grammar ready for matching, built from GBNF ([`from_gbnf`](Self::from_gbnf)) or a JSON
/// schema. Internally every rule's alternatives are runs of elements (a character set or a
/// rule reference) in one flat array, each run terminated by an end marker; a parse
/// position is an index into that array.
#[derive(Debug, Clone)]
pub struct CompiledGrammar {
    pub(crate) elems: Vec<Elem>,
    pub(crate) charsets: Vec<CharSet>,
    /// Start position of each alternative, per rule.
    pub(crate) alts: Vec<Vec<u32>>,
    pub(crate) names: Vec<String>,
    pub(crate) root: u32,
}

enum Low {
    Chars(CharSet),
    Ref(u32),
}

struct Lowering {
    ids: HashMap<String, u32>,
    names: Vec<String>,
    pos: Vec<(usize, usize)>,
    bodies: Vec<Option<Vec<Vec<Low>>>>,
    size: usize,
}

impl CompiledGrammar {
    /// Parses and compiles GBNF text whose start rule is `root`.
    pub fn from_gbnf(src: &str) -> Result<Self, GrammarError> {
        let defs = parse(src)?;
        let mut low = Lowering {
            ids: HashMap::new(),
            names: Vec::new(),
            pos: Vec::new(),
            bodies: Vec::new(),
            size: 0,
        };
        for def in &defs {
            if low.ids.contains_key(&def.name) {
                let kind = GrammarErrorKind::DuplicateRule(def.name.clone());
                return Err(GrammarError {
                    line: def.pos.0,
                    column: def.pos.1,
                    kind,
                });
            }
            let id = low.new_rule(def.name.clone(), def.pos);
            low.ids.insert(def.name.clone(), id);
        }
        let Some(&root) = low.ids.get("root") else {
            let (line, column) = defs.first().map_or((1, 1), |d| d.pos);
            return Err(GrammarError {
                line,
                column,
                kind: GrammarErrorKind::MissingRoot,
            });
        };
        for (id, def) in defs.iter().enumerate() {
            let body = low.alts(def, &def.alts)?;
            low.bodies[id] = Some(body);
        }
        low.check_left_recursion()?;
        Ok(low.finish(root))
    }

    /// Rule names by index; generated rules are named after the rule they came from.
    pub fn rule_names(&self) -> &[String] {
        &self.names
    }

    /// Number of rules, generated ones included.
    pub fn rule_count(&self) -> usize {
        self.alts.len()
    }
}

impl Lowering {
    fn new_rule(&mut self, name: String, pos: (usize, usize)) -> u32 {
        // Generated rules stay out of `ids`: their names may clash with a user's rule.
        let id = self.names.len() as u32;
        self.names.push(name);
        self.pos.push(pos);
        self.bodies.push(None);
        id
    }

    fn generated(&mut self, base: &str, pos: (usize, usize), body: Vec<Vec<Low>>) -> u32 {
        let id = self.new_rule(format!("{base}-{}", self.names.len()), pos);
        self.bodies[id as usize] = Some(body);
        id
    }

    fn grow(&mut self, n: usize, pos: (usize, usize)) -> Result<(), GrammarError> {
        self.size += n;
        if self.size > MAX_ELEMS {
            let kind = GrammarErrorKind::TooLarge(format!(
                "more than {MAX_ELEMS} elements after expanding repetitions"
            ));
            return Err(GrammarError {
                line: pos.0,
                column: pos.1,
                kind,
            });
        }
        Ok(())
    }

    fn alts(&mut self, def: &RuleDef, alts: &[Vec<Item>]) -> Result<Vec<Vec<Low>>, GrammarError> {
        alts.iter().map(|seq| self.seq(def, seq)).collect()
    }

    fn seq(&mut self, def: &RuleDef, seq: &[Item]) -> Result<Vec<Low>, GrammarError> {
        let mut out = Vec::new();
        for item in seq {
            self.item(def, item, &mut out)?;
        }
        Ok(out)
    }

    /// Lowers one item, expanding its repetition: `x{m,n}` is m copies of `x` followed by
    /// a chain of n-m nested optionals; `x{m,}` is m copies followed by `x*`.
    fn item(&mut self, def: &RuleDef, item: &Item, out: &mut Vec<Low>) -> Result<(), GrammarError> {
        let single = item.min == 1 && item.max == Some(1);
        let base: Vec<Low> = match &item.atom {
            Atom::Literal(cs) => cs.iter().map(|&c| Low::Chars(CharSet::single(c))).collect(),
            Atom::Chars(set) => vec![Low::Chars(set.clone())],
            Atom::Ref(name) => match self.ids.get(name) {
                Some(&id) => vec![Low::Ref(id)],
                None => {
                    let kind = GrammarErrorKind::UnknownRule(name.clone());
                    return Err(GrammarError {
                        line: item.pos.0,
                        column: item.pos.1,
                        kind,
                    });
                }
            },
            Atom::Group(alts) => {
                let mut body = self.alts(def, alts)?;
                if single && body.len() == 1 {
                    body.pop().unwrap_or_default()
                } else {
                    vec![Low::Ref(self.generated(&def.name, item.pos, body))]
                }
            }
        };
        if single {
            self.grow(base.len(), item.pos)?;
            out.extend(base);
            return Ok(());
        }
        // Repeat a single element; a longer base becomes its own rule first.
        let unit = if base.len() == 1 {
            base.into_iter().next().unwrap_or(Low::Ref(0))
        } else {
            Low::Ref(self.generated(&def.name, item.pos, vec![base]))
        };
        let copy = |u: &Low| match u {
            Low::Chars(s) => Low::Chars(s.clone()),
            Low::Ref(r) => Low::Ref(*r),
        };
        self.grow(
            item.min as usize + 2 * (item.max.unwrap_or(item.min) - item.min) as usize + 2,
            item.pos,
        )?;
        for _ in 0..item.min {
            out.push(copy(&unit));
        }
        match item.max {
            None => {
                // star ::= unit star | ""
                let id = self.new_rule(format!("{}-{}", def.name, self.names.len()), item.pos);
                self.bodies[id as usize] = Some(vec![vec![copy(&unit), Low::Ref(id)], vec![]]);
                out.push(Low::Ref(id));
            }
            Some(max) if max > item.min => {
                // opt_1 ::= unit | "" ; opt_k ::= unit opt_(k-1) | ""
                let mut prev = self.generated(&def.name, item.pos, vec![vec![copy(&unit)], vec![]]);
                for _ in 1..max - item.min {
                    let body = vec![vec![copy(&unit), Low::Ref(prev)], vec![]];
                    prev = self.generated(&def.name, item.pos, body);
                }
                out.push(Low::Ref(prev));
            }
            Some(_) => {}
        }
        Ok(())
    }

    fn body(&self, r: usize) -> &[Vec<Low>] {
        self.bodies[r].as_deref().unwrap_or(&[])
    }

    /// Refuses left recursion, including through prefixes that can match nothing: the
    /// matcher expands rule references eagerly and would never terminate on it.
    fn check_left_recursion(&self) -> Result<(), GrammarError> {
        let n = self.names.len();
        let mut nullable = vec![false; n];
        let mut changed = true;
        while changed {
            changed = false;
            for r in 0..n {
                if !nullable[r]
                    && self.body(r).iter().any(|alt| {
                        alt.iter()
                            .all(|e| matches!(e, Low::Ref(x) if nullable[*x as usize]))
                    })
                {
                    nullable[r] = true;
                    changed = true;
                }
            }
        }
        // Left-corner edges: r -> x when x can be the first thing r expands to.
        let edges: Vec<Vec<u32>> = (0..n)
            .map(|r| {
                let mut e = Vec::new();
                for alt in self.body(r) {
                    for low in alt {
                        match low {
                            Low::Ref(x) => {
                                e.push(*x);
                                if !nullable[*x as usize] {
                                    break;
                                }
                            }
                            Low::Chars(_) => break,
                        }
                    }
                }
                e
            })
            .collect();
        // Iterative DFS with colours: 0 new, 1 on the path, 2 done.
        let mut colour = vec![0u8; n];
        for start in 0..n {
            if colour[start] != 0 {
                continue;
            }
            let mut stack = vec![(start, 0usize)];
            colour[start] = 1;
            while let Some(&mut (r, ref mut i)) = stack.last_mut() {
                if let Some(&x) = edges[r].get(*i) {
                    *i += 1;
                    let x = x as usize;
                    match colour[x] {
                        0 => {
                            colour[x] = 1;
                            stack.push((x, 0));
                        }
                        1 => {
                            // Name the user's rule the generated one came from.
                            let name = self.names[x]
                                .rsplit_once('-')
                                .filter(|(_, d)| d.parse::<u32>().is_ok())
                                .map_or(self.names[x].as_str(), |(b, _)| b);
                            let (line, column) = self.pos[x];
                            let kind = GrammarErrorKind::LeftRecursion(name.to_string());
                            return Err(GrammarError { line, column, kind });
                        }
                        _ => {}
                    }
                } else {
                    colour[r] = 2;
                    stack.pop();
                }
            }
        }
        Ok(())
    }

    fn finish(self, root: u32) -> CompiledGrammar {
        let mut elems = Vec::with_capacity(self.size + self.names.len() * 2);
        let mut charsets: Vec<CharSet> = Vec::new();
        let mut set_ids: HashMap<CharSet, u32> = HashMap::new();
        let mut alts = Vec::with_capacity(self.names.len());
        for body in self.bodies {
            let mut starts = Vec::new();
            for alt in body.unwrap_or_default() {
                starts.push(elems.len() as u32);
                for low in alt {
                    elems.push(match low {
                        Low::Ref(r) => Elem::Ref(r),
                        Low::Chars(set) => {
                            let next = charsets.len() as u32;
                            let id = *set_ids.entry(set.clone()).or_insert(next);
                            if id == next {
                                charsets.push(set);
                            }
                            Elem::Chars(id)
                        }
                    });
                }
                elems.push(Elem::End);
            }
            alts.push(starts);
        }
        CompiledGrammar {
            elems,
            charsets,
            alts,
            names: self.names,
            root,
        }
    }
}
