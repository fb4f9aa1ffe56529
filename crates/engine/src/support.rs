//! Which tensors the GPU path can read, asked before anything is allocated: `inspect`
//! shows it per tensor, and a session refuses a file whose forward pass needs a tensor
//! the kernels cannot read, naming the tensor and its type, before any Vulkan buffer or
//! import exists.
//!
//! The rules are the kernels' own: a matrix (2-D) is read in place by the matmul and
//! embedding kernels when [`kernels::supported_weight_type`] says so and its rows are
//! whole 64-element chunks and whole blocks (`row_multiple`: 256 for the K-quants);
//! a vector (norm weights, biases) is bound as F32.

use arch::Config;
use gguf::{GgmlType, Gguf, TensorInfo};

use crate::kernels::{self, CHUNK};
use crate::EngineError;

/// The row length a matrix of `ty` must be a multiple of on the GPU: whole chunks of
/// [`CHUNK`] elements (the kernels' unit of work) made of whole blocks of the type.
pub(crate) fn row_multiple(ty: GgmlType) -> usize {
    ty.block_size().max(CHUNK)
}

/// Whether the GPU path can read tensor `t`; `Err` says why not (without the name).
pub fn tensor_support(t: &TensorInfo) -> Result<(), String> {
    match t.shape.len() {
        1 if t.ty == GgmlType::F32 => Ok(()),
        1 => Err(format!(
            "a vector of type {}: the GPU path binds vectors as F32",
            t.ty.name()
        )),
        2 if !kernels::supported_weight_type(t.ty) => Err(format!(
            "type {} is not read by the GPU kernels (they read {})",
            t.ty.name(),
            kernels::supported_weight_type_names()
        )),
        2 => {
            let cols = t.shape[0];
            let m = row_multiple(t.ty) as u64;
            if cols.is_multiple_of(m) {
                Ok(())
            } else {
                Err(format!(
                    "rows of {cols} elements of type {}: the GPU kernels need a multiple of {m}",
                    t.ty.name()
                ))
            }
        }
        n => Err(format!("a {n}-D tensor: the GPU path reads 1-D and 2-D")),
    }
}

/// Refuses a file whose forward pass (the tensors `cfg` expects) needs a tensor the GPU
/// path cannot read, naming the first such tensor. Tensors the forward pass does not
/// read are not looked at; missing ones are left to the model builder's own error.
pub fn check_gpu_readable(cfg: &Config, g: &Gguf) -> Result<(), EngineError> {
    for (name, _) in cfg.expected_tensors() {
        if let Some(t) = g.tensor(&name) {
            tensor_support(t).map_err(|why| EngineError::Tensor {
                name: name.clone(),
                why,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: GgmlType, shape: &[u64]) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            shape: shape.to_vec(),
            ty,
            offset: 0,
        }
    }

    #[test]
    fn rules_follow_the_kernels() {
        assert!(tensor_support(&info(GgmlType::Q8_0, &[576, 3])).is_ok());
        assert!(tensor_support(&info(GgmlType::F32, &[576])).is_ok());
        let e = tensor_support(&info(GgmlType::Q8_0, &[32, 3])).unwrap_err();
        assert!(
            e.contains("rows of 32") && e.contains("multiple of 64"),
            "{e}"
        );
        let e = tensor_support(&info(GgmlType::IQ4_NL, &[64, 3])).unwrap_err();
        assert!(e.contains("IQ4_NL is not read by the GPU kernels"), "{e}");
        assert!(e.contains("Q8_0"), "{e}");
        let e = tensor_support(&info(GgmlType::F16, &[64])).unwrap_err();
        assert!(e.contains("vector of type F16"), "{e}");
        assert_eq!(row_multiple(GgmlType::Q4_K), 256);
        assert_eq!(row_multiple(GgmlType::Q5_0), 64);
        assert_eq!(row_multiple(GgmlType::BF16), 64);
    }
}
