//! Driver defects measured here that vkdecode cannot work around from its side, checked
//! against the capabilities record so `vkdecode info` and every load can say so.

use super::Capabilities;

/// The variable Mesa's CPU detection takes an override from (`avx`, `sse4.1`, ...).
pub const MESA_CPU_CAPS_ENV: &str = "GALLIUM_OVERRIDE_CPU_CAPS";

impl Capabilities {
    /// A known defect of this driver on this machine, with the workaround, or `None`.
    ///
    /// Mesa 25 lavapipe built on LLVM 15 (Debian bookworm-backports' 25.0.7) computes
    /// wrong results on an AVX-512 CPU (an AMD EPYC with AVX-512 here): 6 of the 11
    /// kernel tests fail (a Q4_0 embedding row reads as zeros, attention is off by 0.07)
    /// and the default model's logits are NaN at its first prompt token, while Mesa
    /// 22.3.6 on the same LLVM and machine passes all of them. Limiting Mesa's CPU features
    /// to AVX (`GALLIUM_OVERRIDE_CPU_CAPS=avx`) gives correct results (docs/drivers.md).
    pub fn known_defect(&self) -> Option<String> {
        let overridden = std::env::var_os(MESA_CPU_CAPS_ENV).is_some();
        mesa25_llvm15_on_avx512(
            &self.driver_name,
            &self.driver_info,
            cpu_has_avx512f(),
            overridden,
        )
        .then(|| {
            format!(
                "{} {} miscomputes on this AVX-512 CPU (wrong kernel results, NaN logits); \
                 set {MESA_CPU_CAPS_ENV}=avx, or use another Mesa (docs/drivers.md)",
                self.driver_name, self.driver_info
            )
        })
    }
}

/// Whether the driver is Mesa 25 lavapipe on LLVM 15 with an AVX-512 CPU and no CPU
/// feature override.
fn mesa25_llvm15_on_avx512(name: &str, info: &str, avx512f: bool, overridden: bool) -> bool {
    name == "llvmpipe"
        && info.starts_with("Mesa 25.")
        && info.contains("LLVM 15.")
        && avx512f
        && !overridden
}

fn cpu_has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::mesa25_llvm15_on_avx512 as defect;

    #[test]
    fn only_mesa_25_on_llvm_15_with_avx512_and_no_override() {
        let m25 = "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)";
        assert!(defect("llvmpipe", m25, true, false));
        assert!(!defect("llvmpipe", m25, true, true), "overridden");
        assert!(!defect("llvmpipe", m25, false, false), "no AVX-512");
        assert!(!defect(
            "llvmpipe",
            "Mesa 22.3.6 (LLVM 15.0.6)",
            true,
            false
        ));
        assert!(!defect(
            "llvmpipe",
            "Mesa 25.2.0 (LLVM 19.1.7)",
            true,
            false
        ));
        assert!(!defect(
            "radv",
            "Mesa 25.0.7-2~bpo12+1 (LLVM 15.0.6)",
            true,
            false
        ));
    }
}
