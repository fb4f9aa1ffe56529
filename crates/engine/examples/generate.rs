//! From the checkout: `cargo run --release -p engine --example generate -- [PROMPT]`.
use engine::{generate::LoadOptions, Event, GenerateOptions, Generator, SamplerOptions};

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q8_0.gguf";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1);
    let prompt = arg.as_deref().unwrap_or("The capital of France is");
    let mut generator = Generator::open(MODEL, &LoadOptions::default())?;
    let mut opts = GenerateOptions::default();
    (opts.max_tokens, opts.sampler) = (Some(32), SamplerOptions::greedy());
    print!("{prompt}");
    let gen = generator.generate_text(prompt, &opts, &mut |event| {
        if let Event::Text(text) = event {
            print!("{text}");
        }
        std::ops::ControlFlow::Continue(())
    })?;
    let (n, tok_s) = (gen.stats.n_generated, gen.stats.decode_tok_s());
    println!("\n[{n} tokens, {tok_s:.1} tok/s]");
    Ok(())
}
