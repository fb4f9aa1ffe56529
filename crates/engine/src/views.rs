//! The texel views the graph's descriptor sets read: the weights (in the texel format
//! their type is read with) and the activations read as matmul input (RGBA32F), created
//! once at load and kept alive by [`crate::model::GpuModel`].

use std::sync::Arc;

use gguf::GgmlType;
use vk::{BufferBinding, BufferView, TexelFormat};

use crate::activations::Activations;
use crate::kernels;
use crate::EngineError;
use residency::ViewPart;

/// A texel view spanning several weight parts, and each part's byte offset inside it.
pub(crate) type SpanningView = (Arc<BufferView>, Vec<u64>);

/// Texel views shared by the dispatches of the graph.
pub(crate) struct Views {
    pub(crate) ctx: Arc<vk::Context>,
    /// R32UI view of 16 bytes for weight slots a dispatch does not use.
    pub(crate) dummy_w: Arc<BufferView>,
    /// RGBA32F views of the activations read as matmul input.
    pub(crate) x: Arc<BufferView>,
    pub(crate) xg: Arc<BufferView>,
    pub(crate) q: Arc<BufferView>,
    pub(crate) att_out: Arc<BufferView>,
    pub(crate) hb: Arc<BufferView>,
    pub(crate) all: Vec<Arc<BufferView>>,
}

impl Views {
    pub(crate) fn new(ctx: &Arc<vk::Context>, acts: &Activations) -> Result<Views, EngineError> {
        let f = |b: &vk::Buffer| {
            BufferView::new(ctx, b.binding(), TexelFormat::Rgba32Float).map(Arc::new)
        };
        let dummy_w = Arc::new(BufferView::new(
            ctx,
            acts.dummy.binding(),
            TexelFormat::R32Uint,
        )?);
        let (x, xg, att_out, hb) = (f(&acts.x)?, f(&acts.xg)?, f(&acts.att_out)?, f(&acts.hb)?);
        let q = f(&acts.q)?;
        let all = vec![
            Arc::clone(&dummy_w),
            Arc::clone(&x),
            Arc::clone(&xg),
            Arc::clone(&q),
            Arc::clone(&att_out),
            Arc::clone(&hb),
        ];
        Ok(Views {
            ctx: Arc::clone(ctx),
            dummy_w,
            x,
            xg,
            q,
            att_out,
            hb,
            all,
        })
    }

    /// An RGBA16F view of a key or value cache (kept alive by the model).
    pub(crate) fn cache(&mut self, binding: BufferBinding) -> Result<Arc<BufferView>, EngineError> {
        let v = Arc::new(BufferView::new(
            &self.ctx,
            binding,
            TexelFormat::Rgba16Float,
        )?);
        self.all.push(Arc::clone(&v));
        Ok(v)
    }

    /// The texel view of a weight part (kept alive by the model): RGBA32UI for Q8_0 (read
    /// as 16-byte texels), R32UI otherwise (see [`kernels::weight_texel_format`]).
    pub(crate) fn weights(
        &mut self,
        ty: GgmlType,
        p: &ViewPart,
        row_bytes: u64,
    ) -> Result<Arc<BufferView>, EngineError> {
        let format = kernels::weight_texel_format(ty);
        let v = Arc::new(BufferView::new(&self.ctx, p.binding.clone(), format)?);
        // whole texels: the part's last bytes must not fall in a partial texel
        let end = p.byte_offset + p.n_rows * row_bytes;
        if v.texels() * format.size() < end {
            return Err(EngineError::Unsupported(format!(
                "a {} weight part ending at byte {end} of a {}-byte binding that is not a whole number of {}-byte texels",
                ty.name(),
                p.binding.range,
                format.size()
            )));
        }
        self.all.push(Arc::clone(&v));
        Ok(v)
    }

    /// One texel view spanning every part of `parts` (each with its tensor's row bytes),
    /// and each part's byte offset inside it; `None` when they lie in different buffers
    /// or the span exceeds `maxTexelBufferElements`.
    pub(crate) fn spanning(
        &mut self,
        ty: GgmlType,
        parts: &[(&ViewPart, u64)],
    ) -> Result<Option<SpanningView>, EngineError> {
        let Some(&(first, _)) = parts.first() else {
            return Ok(None);
        };
        if parts
            .iter()
            .any(|(p, _)| p.binding.buffer != first.binding.buffer)
        {
            return Ok(None);
        }
        let format = kernels::weight_texel_format(ty);
        let texel = format.size();
        let (align, max_texels) = self.ctx.texel_limits();
        let start = parts
            .iter()
            .map(|(p, _)| p.binding.offset)
            .min()
            .unwrap_or(0);
        let start = start - start % align.max(1);
        let end = parts
            .iter()
            .map(|(p, rb)| p.binding.offset + p.byte_offset + p.n_rows * rb)
            .max()
            .unwrap_or(start);
        let texels = (end - start).div_ceil(texel);
        if texels > u64::from(max_texels) {
            return Ok(None);
        }
        // whole texels, none past the end of the parts' own bindings
        let limit = parts
            .iter()
            .map(|(p, _)| p.binding.offset + p.binding.range)
            .max()
            .unwrap_or(start);
        if start + texels * texel > limit {
            return Ok(None);
        }
        let binding = BufferBinding {
            buffer: first.binding.buffer.clone(),
            offset: start,
            range: texels * texel,
        };
        let v = Arc::new(BufferView::new(&self.ctx, binding, format)?);
        self.all.push(Arc::clone(&v));
        let offsets = parts
            .iter()
            .map(|(p, _)| p.binding.offset - start + p.byte_offset)
            .collect();
        Ok(Some((v, offsets)))
    }
}
