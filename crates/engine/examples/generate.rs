//! Text through the engine's API: `cargo run --release -p engine --example generate --
//! [PROMPT]` (the default SmolLM2 Q8_0 model, greedy, 32 tokens).

use std::ops::ControlFlow;
use std::sync::Arc;

use engine::generate::{load, LoadOptions};
use engine::{Event, GenerateOptions, Generator, SamplerOptions};

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/SmolLM2-135M-Instruct.Q8_0.gguf"
);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or("The capital of France is".into());
    let file = Arc::new(gguf::GgufFile::open(MODEL)?);
    let tok = Arc::new(tokenizer::Tokenizer::from_gguf(file.gguf())?);
    let mut generator =
        Generator::new(Box::new(load(&file, &LoadOptions::default())?.session), tok);
    let mut opts = GenerateOptions::default();
    (opts.max_tokens, opts.sampler) = (Some(32), SamplerOptions::greedy());
    print!("{prompt}");
    let gen = generator.generate_text(&prompt, &opts, &mut |event| {
        if let Event::Text(text) = event {
            print!("{text}");
        }
        ControlFlow::Continue(())
    })?;
    let tok_s = gen.stats.decode_tok_s();
    println!("\n[{} tokens, {tok_s:.1} tok/s]", gen.stats.n_generated);
    Ok(())
}
