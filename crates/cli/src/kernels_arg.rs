//! `--kernels`: the one flag that run, chat, serve, bench and info share to pick the
//! kernel set, declared once and flattened into each command's arguments. Its id is
//! `kernels`: the field's own name would collide with run's `--profile`.

use engine::kernels::KernelProfile;

#[derive(clap::Args, Debug, Clone, Copy)]
pub struct KernelsArg {
    /// Kernel set: `cpu` (shaped for CPU devices such as lavapipe: 8-lane workgroups,
    /// column-split decode, prefill GEMM), `gpu` (shaped for GPUs: wide workgroups,
    /// correct at any subgroup size), or `auto` (by device type; `vkdecode info` says
    /// which and why).
    #[arg(id = "kernels", long = "kernels", value_name = "auto|cpu|gpu", default_value = "auto", value_parser = KernelProfile::parse)]
    pub profile: KernelProfile,
}
