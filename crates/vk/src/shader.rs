//! SPIR-V modules as the build embeds them: [`Shader`] (one module, its name and the
//! descriptor type of each binding) and [`ShaderPack`] (a zstd frame of similar modules,
//! unpacked whenever one of them is asked for, and not kept). Build scripts generate static
//! tables of both with the `shader-build` crate; this crate's own table holds the
//! checksum kernel ([`CHECKSUM`]), the engine's holds its kernel registry.

use std::hash::{Hash, Hasher};

use crate::DescriptorKind;

mod table {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

/// `checksum.comp`: the position-dependent checksum of a byte range
/// ([`crate::checksum`]), used to prove weights reach the GPU intact.
pub static CHECKSUM: &Shader = &table::SHADERS[0];

/// A group of modules, concatenated and compressed into one zstd frame by shader-build.
pub struct ShaderPack {
    /// The group's name (`matmul.q8_0`).
    name: &'static str,
    /// Words of all its modules together.
    words: usize,
    /// The zstd frame.
    zst: &'static [u8],
}

impl ShaderPack {
    /// A pack of `words` words compressed into `zst` (generated code calls this).
    pub const fn new(name: &'static str, words: usize, zst: &'static [u8]) -> ShaderPack {
        ShaderPack { name, words, zst }
    }

    fn unpack(&self) -> Vec<u32> {
        let start = std::time::Instant::now();
        let mut words = vec![0u32; self.words];
        // The frame was written by the build from these very words, and the spirv_val
        // test unpacks every pack, so a failure is a broken build, not bad input.
        let n = zstd::bulk::decompress_to_buffer(self.zst, bytemuck::cast_slice_mut(&mut words))
            .unwrap_or_else(|e| panic!("the embedded SPIR-V pack {} is corrupt: {e}", self.name));
        assert_eq!(
            n,
            self.words * 4,
            "SPIR-V pack {} has the wrong size",
            self.name
        );
        tracing::debug!(
            pack = self.name,
            bytes = n,
            micros = start.elapsed().as_micros() as u64,
            "unpacked SPIR-V"
        );
        words
    }
}

/// One SPIR-V module: a compute kernel, or one build-time variant of it.
pub struct Shader {
    name: &'static str,
    kinds: &'static [DescriptorKind],
    pack: &'static ShaderPack,
    start: usize,
    end: usize,
}

impl Shader {
    /// Module `name` with bindings `kinds`, words `start..end` of `pack` (generated code
    /// calls this).
    pub const fn new(
        name: &'static str,
        kinds: &'static [DescriptorKind],
        pack: &'static ShaderPack,
        start: usize,
        end: usize,
    ) -> Shader {
        Shader {
            name,
            kinds,
            pack,
            start,
            end,
        }
    }

    /// `stem` or `stem.variant` (`matmul.q8_0.tb4.add`); unique within a build.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Bindings the shader declares in set 0 (highest `binding` + 1, over every variant
    /// of its source).
    pub fn bindings(&self) -> u32 {
        self.kinds.len() as u32
    }

    /// Descriptor type of each binding 0..bindings() (reflected from the SPIR-V of every
    /// variant of its source).
    pub fn descriptor_kinds(&self) -> &'static [DescriptorKind] {
        self.kinds
    }

    /// The SPIR-V words, unpacked from the pack on each call (a pipeline is created
    /// once; keeping every unpacked pack would hold megabytes for the whole run).
    pub fn spirv(&self) -> Vec<u32> {
        let mut words = self.pack.unpack();
        words.truncate(self.end);
        words.drain(..self.start);
        words
    }
}

impl std::fmt::Debug for Shader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shader({})", self.name)
    }
}

/// Modules are equal when their names are: a build names each module once.
impl PartialEq for Shader {
    fn eq(&self, other: &Shader) -> bool {
        self.name == other.name
    }
}

impl Eq for Shader {}

impl Hash for Shader {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}
