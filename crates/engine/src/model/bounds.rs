//! Record-time checks of the forward pass (the matmuls' own are in matmul.rs): every
//! dispatch's writes fit the ranges bound (robustBufferAccess is off, so writing past a
//! buffer would be undefined behaviour),
//! and every pipeline created at load that a dispatch needs exists (the matmul pipelines
//! are created where their dispatch is recorded, on first use).

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

/// A pipeline the recorder needs was not created at load (embed, attention and the
/// families' steps; the matmuls are created on first use).
pub(super) fn missing(what: &str) -> EngineError {
    EngineError::Unsupported(format!("internal: no pipeline was created for `{what}`"))
}
