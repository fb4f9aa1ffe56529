//! Every embedded SPIR-V module (the engine's registry and vk's checksum) passes
//! `spirv-val` for the environment the shaders are compiled for (vulkan1.2, see
//! crates/shader-build) and for vulkan1.3, whose rules newer drivers
//! apply. Drivers differ in what they check, so the modules are held to the validator
//! rather than to one driver. What this `spirv-val` (2023.1) misses, a sampled image of
//! a buffer (`samplerBuffer`, which Mesa 25 rejects), shader-build refuses itself.
//!
//! The modules checked are the words `Shader::spirv` hands to Vulkan, unpacked from the
//! embedded zstd packs, not the build's `.spv` files; a second test holds the engine's
//! words to the files glslc wrote.
//!
//! `spirv-val` comes from Debian's `spirv-tools` (scripts/setup installs it). The test
//! fails without it unless `VKDECODE_ALLOW_NO_SPIRV_VAL=1`.

use std::path::Path;
use std::process::Command;

/// Every embedded module: the engine's, then vk's.
fn modules() -> Vec<&'static vk::Shader> {
    let mut all: Vec<&'static vk::Shader> = engine::kernels::shaders().iter().collect();
    all.push(vk::CHECKSUM);
    all
}

fn spirv_val() -> Option<String> {
    let exe = std::env::var("SPIRV_VAL").unwrap_or_else(|_| "spirv-val".to_string());
    match Command::new(&exe).arg("--version").output() {
        Ok(o) if o.status.success() => Some(exe),
        _ if std::env::var("VKDECODE_ALLOW_NO_SPIRV_VAL").is_ok_and(|v| v == "1") => None,
        _ => panic!(
            "`{exe}` not found: install spirv-tools (scripts/setup does), or set \
             VKDECODE_ALLOW_NO_SPIRV_VAL=1 to skip"
        ),
    }
}

/// `spirv-val --target-env env` on `path`: `Err(its message)` when it refuses the module.
fn validate(exe: &str, env: &str, path: &Path) -> Result<(), String> {
    let o = Command::new(exe)
        .arg("--target-env")
        .arg(env)
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {exe}: {e}"));
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

#[test]
fn every_module_passes_spirv_val() {
    let Some(exe) = spirv_val() else { return };
    let all = modules();
    let dir = std::env::temp_dir().join(format!("vkdecode-spirv-val-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&k) = all.get(i) else { break };
                let path = dir.join(format!("{}.spv", k.name()));
                std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&k.spirv())).unwrap();
                for env in ["vulkan1.2", "vulkan1.3"] {
                    if let Err(msg) = validate(&exe, env, &path) {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("{} ({env}): {msg}", k.name()));
                    }
                }
            });
        }
    });
    std::fs::remove_dir_all(&dir).ok();
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} modules fail spirv-val:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

/// The check has teeth: a truncated module is refused.
#[test]
fn spirv_val_refuses_a_broken_module() {
    let Some(exe) = spirv_val() else { return };
    let dir = std::env::temp_dir().join(format!("vkdecode-spirv-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let words = vk::CHECKSUM.spirv();
    let path = dir.join("truncated.spv");
    std::fs::write(
        &path,
        bytemuck::cast_slice::<u32, u8>(&words[..words.len() / 2]),
    )
    .unwrap();
    let got = validate(&exe, "vulkan1.2", &path);
    std::fs::remove_dir_all(&dir).ok();
    assert!(got.is_err(), "spirv-val accepted half a module");
}

/// The SPIR-V magic number, first word of every module.
const SPIRV_MAGIC: u32 = 0x0723_0203;

/// Every module unpacks to a whole module: the magic number, a 5-word header, then
/// instructions whose word counts end exactly at the module's end; and the engine's to the
/// very words glslc wrote to its build's output directory.
#[test]
fn every_module_unpacks_to_what_glslc_wrote() {
    for k in modules() {
        let words = k.spirv();
        assert!(words.len() > 5, "{}: {} words", k.name(), words.len());
        assert_eq!(words[0], SPIRV_MAGIC, "{}: magic number", k.name());
        let mut i = 5;
        while i < words.len() {
            let count = (words[i] >> 16) as usize;
            assert!(
                count > 0,
                "{}: zero-length instruction at word {i}",
                k.name()
            );
            i += count;
        }
        assert_eq!(i, words.len(), "{}: last instruction overruns", k.name());
        if k == vk::CHECKSUM {
            continue; // built into vk's output directory, not the engine's
        }
        let spv = Path::new(env!("OUT_DIR")).join(format!("{}.spv", k.name()));
        let compiled = std::fs::read(&spv).unwrap_or_else(|e| panic!("{}: {e}", spv.display()));
        assert!(
            bytemuck::cast_slice::<u32, u8>(&words) == compiled.as_slice(),
            "{} unpacks to other words than {}",
            k.name(),
            spv.display()
        );
    }
}
