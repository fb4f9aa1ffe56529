//! The engine's kernels and their build-time variants, listed once.
//!
//! Each entry is one shader of `shaders/` and the typed fields that select its variants;
//! every value of a field carries the `-D` defines it compiles with. The engine's build
//! script reads this file (it is not a module of the library), compiles one SPIR-V module
//! per combination of values with shader-build, and generates [`Kernel`] with one enum
//! variant per entry and one field per field here, so call sites ask for
//! `Kernel::Matmul { wtype, tb: 4, epilogue: Epilogue::Add }` and the compiler checks the
//! names. A combination not listed is not built: `Kernel::shader` answers `None`.
//!
//! Modes are defines, not specialization constants: lavapipe compiles a constant's dead
//! branches too (docs/facts.md, "Decode kernels on lavapipe"), so each module holds only
//! the code its variant runs. Only the variants the engine can ask for are listed.
//!
//! [`Kernel`]: super::registry::Kernel

/// One typed field of a kernel's variants.
pub struct Field {
    /// The field's name in the generated enum variant (`wtype`).
    pub name: &'static str,
    /// Its Rust type, as the generated code spells it.
    pub ty: &'static str,
    pub values: &'static [Value],
}

/// One value of a [`Field`].
pub struct Value {
    /// The value in module names (`q8_0`, `tb4`): `matmul.q8_0.tb4.add`.
    pub label: &'static str,
    /// The value as a Rust pattern (`gguf::GgmlType::Q8_0`, `4`).
    pub rust: &'static str,
    /// Its defines, without `-D`.
    pub defines: &'static [&'static str],
}

/// One shader and the fields its variants are built over (none: built once).
pub struct KernelDecl {
    /// The variant of the generated `Kernel` (`MatmulSplit`).
    pub variant: &'static str,
    /// The shader: `shaders/<shader>.comp`.
    pub shader: &'static str,
    /// Defines every module of the shader gets.
    pub defines: &'static [&'static str],
    pub fields: &'static [&'static Field],
}

const fn v(label: &'static str, rust: &'static str, defines: &'static [&'static str]) -> Value {
    Value {
        label,
        rust,
        defines,
    }
}

/// The weight types the matmul and embedding kernels read (`include/quant*.glsl`).
pub const WTYPE: Field = Field {
    name: "wtype",
    ty: "gguf::GgmlType",
    values: &[
        v("q8_0", "gguf::GgmlType::Q8_0", &["WTYPE_Q8_0"]),
        v("q4_0", "gguf::GgmlType::Q4_0", &["WTYPE_Q4_0"]),
        v("q4_1", "gguf::GgmlType::Q4_1", &["WTYPE_Q4_1"]),
        v("q5_0", "gguf::GgmlType::Q5_0", &["WTYPE_Q5_0"]),
        v("q5_1", "gguf::GgmlType::Q5_1", &["WTYPE_Q5_1"]),
        v("bf16", "gguf::GgmlType::BF16", &["WTYPE_BF16"]),
        v("f16", "gguf::GgmlType::F16", &["WTYPE_F16"]),
        v("f32", "gguf::GgmlType::F32", &["WTYPE_F32"]),
        v("q4_k", "gguf::GgmlType::Q4_K", &["WTYPE_Q4_K"]),
        v("q5_k", "gguf::GgmlType::Q5_K", &["WTYPE_Q5_K"]),
        v("q6_k", "gguf::GgmlType::Q6_K", &["WTYPE_Q6_K"]),
        v("q3_k", "gguf::GgmlType::Q3_K", &["WTYPE_Q3_K"]),
        v("q2_k", "gguf::GgmlType::Q2_K", &["WTYPE_Q2_K"]),
    ],
};

/// The fused matmul steps of the forward pass (`matmul::Epilogue`).
pub const EPILOGUE: Field = Field {
    name: "epilogue",
    ty: "crate::kernels::Epilogue",
    values: &[
        // q/k/v: rmsnorm in, rope + KV-cache write out
        v(
            "qkv",
            "crate::kernels::Epilogue::Qkv",
            &["IN_RMSNORM", "OUT_MODE=2"],
        ),
        // attn_output, ffn_down: residual add (and the next norm's input)
        v("add", "crate::kernels::Epilogue::Add", &["OUT_MODE=1"]),
        // gate/up: rmsnorm in, SwiGLU out
        v(
            "glu",
            "crate::kernels::Epilogue::Glu",
            &["IN_RMSNORM", "OUT_MODE=3"],
        ),
        // the logits, and a plain q/k/v before heads.comp: rmsnorm in, stored
        v(
            "logits",
            "crate::kernels::Epilogue::Logits",
            &["IN_RMSNORM", "OUT_MODE=0"],
        ),
        // attn_output, ffn_down of post-norm families (gemma3): stored for post_norm.comp
        v("store", "crate::kernels::Epilogue::Store", &["OUT_MODE=0"]),
        // gate/up of gemma3: rmsnorm in, GELU(tanh)-gated out
        v(
            "geglu",
            "crate::kernels::Epilogue::GeGlu",
            &["IN_RMSNORM", "OUT_MODE=3", "ACT_GELU"],
        ),
    ],
};

/// Tokens per invocation of the row-per-lane matmul (`TB`): decode 1, prefill 4
/// (`kernels::MATMUL_TB`).
pub const TB: Field = Field {
    name: "tb",
    ty: "u32",
    values: &[v("tb1", "1", &["TB=1"]), v("tb4", "4", &["TB=4"])],
};

/// Tokens per workgroup of the prefill GEMM (`TT`; its per-lane `TB` is at most 4):
/// `kernels::GEMM_TT`.
pub const TT: Field = Field {
    name: "tt",
    ty: "u32",
    values: &[
        v("t2", "2", &["TT=2", "TB=2"]),
        v("t8", "8", &["TT=8", "TB=4"]),
    ],
};

/// Whole rounds of lanes' chunks per row of the column-split matmul (`SPLIT_K`;
/// `kernels::SPLIT_MAX_CHUNKS_PER_LANE`).
pub const SPLIT_K: Field = Field {
    name: "split_k",
    ty: "u32",
    values: &[
        v("k1", "1", &["SPLIT_K=1"]),
        v("k2", "2", &["SPLIT_K=2"]),
        v("k3", "3", &["SPLIT_K=3"]),
        v("k4", "4", &["SPLIT_K=4"]),
    ],
};

/// Every kernel of `shaders/`, in build order.
pub const KERNELS: &[KernelDecl] = &[
    plain("Argmax", "argmax"),
    plain("Attention", "attention"),
    KernelDecl {
        variant: "Embed",
        shader: "embed",
        defines: &[],
        fields: &[&WTYPE],
    },
    plain("Heads", "heads"),
    KernelDecl {
        variant: "Matmul",
        shader: "matmul",
        defines: &[],
        fields: &[&WTYPE, &TB, &EPILOGUE],
    },
    KernelDecl {
        // "logits" too: at batch width it is the plain q/k/v before heads.comp
        variant: "MatmulMm",
        shader: "matmul_mm",
        defines: &[],
        fields: &[&WTYPE, &TT, &EPILOGUE],
    },
    KernelDecl {
        variant: "MatmulSplit",
        shader: "matmul_split",
        defines: &["TB=1"],
        fields: &[&WTYPE, &SPLIT_K, &EPILOGUE],
    },
    plain("PostNorm", "post_norm"),
    plain("Softcap", "softcap"),
];

const fn plain(variant: &'static str, shader: &'static str) -> KernelDecl {
    KernelDecl {
        variant,
        shader,
        defines: &[],
        fields: &[],
    }
}
