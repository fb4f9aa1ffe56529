//! Record-time checks of the forward pass: every dispatch's writes fit the ranges bound
//! (robustBufferAccess is off, so writing past a buffer would be undefined behaviour),
//! and every pipeline created at load that a dispatch needs exists (the matmul pipelines
//! are created where their dispatch is recorded, on first use).

use crate::kernels::{self, MatmulPush};
use crate::model::MatmulCall;
use crate::EngineError;

/// A dispatch that would write `need` bytes of a binding holding `have` is refused.
pub(super) fn check_fits(
    dispatch: &str,
    binding: &str,
    need: u64,
    have: u64,
) -> Result<(), EngineError> {
    if need > have {
        return Err(EngineError::DispatchOutOfBounds {
            dispatch: dispatch.to_string(),
            binding: binding.to_string(),
            need,
            have,
        });
    }
    Ok(())
}

/// What a matmul dispatch of `call` with `push` writes (out0, out1, out2) fits what its
/// set binds ([`kernels::matmul_write_bytes`]).
pub(super) fn check_matmul(
    call: &MatmulCall,
    push: &MatmulPush,
    ctx_len: usize,
) -> Result<(), EngineError> {
    let need = kernels::matmul_write_bytes(
        call.variant.out_mode,
        call.write_xg,
        &call.slots,
        push,
        ctx_len,
    );
    for (i, (&need, &have)) in need.iter().zip(&call.out_bytes).enumerate() {
        check_fits(&call.name, &format!("out{i}"), need, have)?;
    }
    Ok(())
}

/// A pipeline the recorder needs was not created at load (embed, attention and the
/// families' steps; the matmuls are created on first use).
pub(super) fn missing(what: &str) -> EngineError {
    EngineError::Unsupported(format!("internal: no pipeline was created for `{what}`"))
}
