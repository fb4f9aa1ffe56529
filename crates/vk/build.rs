//! Compiles vk's own kernels (`shaders/*.comp` of this crate: the checksum) with
//! shader-build, which writes the `Shader` table `src/shader.rs` includes. The engine's
//! kernels and their variants are built by the engine's build script.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dir = manifest.join("shaders");
    let (comps, includes) = shader_build::sources(&dir);
    let modules: Vec<shader_build::Module> = comps
        .iter()
        .map(|c| shader_build::Module {
            name: c
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 shader name")
                .to_string(),
            source: c.clone(),
            defines: Vec::new(),
        })
        .collect();
    assert_eq!(
        modules.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["checksum"],
        "src/shader.rs names each of vk's shaders by its index"
    );
    shader_build::build(
        &dir.join("include"),
        &includes,
        &modules,
        "crate",
        "shaders.rs",
    );
}
