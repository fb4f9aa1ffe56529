//! The main command's sampling flags beyond the plain values: their ranges, llama-cli's
//! `--logit-bias` syntax, and the grammar `--grammar`/`--json-schema` and their `-file`
//! forms ask for.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context as _, Result};

/// How the main command picks each token: temperature and truncation, penalties, biases,
/// the seed, and a grammar or JSON schema that constrains the text.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 (or below) is greedy (argmax computed on the GPU, 4 bytes
    /// read back per token). Default: 0.8 as llama.cpp on the Vulkan backend, 0 on the
    /// reference backend.
    #[arg(long, allow_negative_numbers = true)]
    pub temp: Option<f32>,

    /// Keep only the K most likely tokens (0 disables).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,

    /// Keep the smallest set of tokens whose probability sums to P, 0 to 1 (1 disables).
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,

    /// Drop tokens less likely than P times the most likely one, 0 to 1 (0 disables).
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,

    /// Penalise tokens seen in the last --repeat-last-n tokens, above 0 (1.0 disables).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,

    /// How many recent tokens (prompt included, as llama.cpp) the repetition, frequency and
    /// presence penalties look at; 0 disables them.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,

    /// Subtract N from a token's logit per time it appears in the last --repeat-last-n
    /// tokens, -2 to 2 (0 disables).
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,

    /// Subtract N from the logit of any token that appears in the last --repeat-last-n
    /// tokens, -2 to 2 (0 disables).
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,

    /// Add BIAS to token TOKEN_ID's logit, as llama-cli: `15043+1`, `15043-0.5`; a bias of
    /// `-inf` bans the token. Repeatable.
    #[arg(long = "logit-bias", value_name = "TOKEN_ID(+|-)BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<LogitBias>,

    /// Random seed for sampling (default: taken from the clock, and reported in the stats).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Constrain the output to a GBNF grammar (llama.cpp's syntax, `root` rule first), given
    /// as text. The grammar masks the logits at every step; end-of-generation is allowed
    /// only where the text is complete.
    #[arg(long, value_name = "GBNF", group = "constraint")]
    pub grammar: Option<String>,

    /// Constrain the output to the GBNF grammar in FILE (see `grammars/` for examples).
    #[arg(long = "grammar-file", value_name = "FILE", group = "constraint")]
    pub grammar_file: Option<PathBuf>,

    /// Constrain the output to JSON that follows this JSON schema (a subset: objects,
    /// arrays, enum, const, strings with length limits, numbers with bounds, anyOf, $ref;
    /// a keyword it cannot enforce is refused by name). Properties come out in the
    /// schema's order. `{}` allows any JSON value.
    #[arg(
        short = 'j',
        long = "json-schema",
        value_name = "SCHEMA",
        group = "constraint"
    )]
    pub json_schema: Option<String>,

    /// As --json-schema, the schema read from FILE.
    #[arg(long = "json-schema-file", value_name = "FILE", group = "constraint")]
    pub json_schema_file: Option<PathBuf>,
}

/// Checks the sampling flags: every value finite and in its range.
pub fn validate(args: &SamplingArgs) -> Result<()> {
    let check = |name: &str, v: f32, ok: bool, range: &str| -> Result<()> {
        if !v.is_finite() || !ok {
            bail!("{name} {v} is out of range: {range}");
        }
        Ok(())
    };
    if let Some(t) = args.temp {
        check("--temp", t, true, "a finite number (0 or below is greedy)")?;
    }
    check(
        "--top-p",
        args.top_p,
        (0.0..=1.0).contains(&args.top_p),
        "0 to 1 (1 disables)",
    )?;
    check(
        "--min-p",
        args.min_p,
        (0.0..=1.0).contains(&args.min_p),
        "0 to 1 (0 disables)",
    )?;
    check(
        "--repeat-penalty",
        args.repeat_penalty,
        args.repeat_penalty > 0.0,
        "above 0 (1 disables)",
    )?;
    for (flag, v) in [
        ("--frequency-penalty", args.frequency_penalty),
        ("--presence-penalty", args.presence_penalty),
    ] {
        check(flag, v, (-2.0..=2.0).contains(&v), "-2 to 2 (0 disables)")?;
    }
    Ok(())
}

/// The grammar `--grammar`, `--grammar-file`, `--json-schema` or `--json-schema-file`
/// asks for (clap lets at most one through), compiled.
pub fn grammar(args: &SamplingArgs) -> Result<Option<Arc<grammar::CompiledGrammar>>> {
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read_to_string(path)
            .with_context(|| format!("{flag}: cannot read {}", path.display()))
    };
    let gbnf = |flag: &str, text: &str| {
        grammar::CompiledGrammar::from_gbnf(text).with_context(|| format!("{flag}: the grammar"))
    };
    let schema = |flag: &str, text: &str| {
        grammar::CompiledGrammar::from_json_schema(text)
            .with_context(|| format!("{flag}: the JSON schema"))
    };
    let g = if let Some(text) = &args.grammar {
        gbnf("--grammar", text)?
    } else if let Some(path) = &args.grammar_file {
        gbnf("--grammar-file", &read("--grammar-file", path)?)?
    } else if let Some(text) = &args.json_schema {
        schema("--json-schema", text)?
    } else if let Some(path) = &args.json_schema_file {
        schema("--json-schema-file", &read("--json-schema-file", path)?)?
    } else {
        return Ok(None);
    };
    Ok(Some(Arc::new(g)))
}

/// One `--logit-bias`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitBias {
    pub token: u32,
    pub bias: f32,
}

/// llama-cli's `TOKEN_ID(+|-)BIAS`, e.g. `15043+1` or `15043-inf`.
pub fn parse_logit_bias(s: &str) -> Result<LogitBias, String> {
    let at = s
        .find(['+', '-'])
        .ok_or_else(|| format!("{s:?} is not TOKEN_ID(+|-)BIAS, e.g. 15043+1"))?;
    let token = s[..at]
        .parse()
        .map_err(|_| format!("{:?} is not a token id (in {s:?})", &s[..at]))?;
    let bias: f32 = s[at..]
        .parse()
        .map_err(|_| format!("{:?} is not a bias (in {s:?})", &s[at..]))?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("bias {bias} (in {s:?}) must be a number or -inf"));
    }
    Ok(LogitBias { token, bias })
}

/// `--seed`, else one taken from the clock (reported in the stats).
pub fn seed_or_clock(seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_logit_bias, LogitBias};

    #[test]
    fn logit_bias_takes_llama_cli_syntax() {
        let b = |token, bias| Ok(LogitBias { token, bias });
        assert_eq!(parse_logit_bias("15043+1"), b(15043, 1.0));
        assert_eq!(parse_logit_bias("7-0.5"), b(7, -0.5));
        assert_eq!(parse_logit_bias("2-inf"), b(2, f32::NEG_INFINITY));
        for bad in ["15043", "x+1", "1+y", "1+inf", "+1"] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
    }
}
