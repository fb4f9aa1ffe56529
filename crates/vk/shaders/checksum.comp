#version 450
// Position-dependent checksum of a byte range, used to prove that weights reach the GPU
// intact whatever the residency path (import / copy). CPU twin: `vk::checksum::cpu`.
//
// For each little-endian u32 word w at index i (counted from the range's start plus
// `word_base`; a partial last word is zero-padded) the kernel adds
//   h1 = fmix32(w ^ (i * 0x9E3779B9u))  and  h2 = fmix32((w + i * 0x85EBCA6Bu) ^ 0xC2B2AE35u)
// into sums[2*out_index] and sums[2*out_index+1] (mod 2^32), so parts of one tensor
// bound separately add up to the tensor's checksum.
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Src { uint words[]; };
layout(std430, set = 0, binding = 1) buffer Sums { uint sums[]; };

layout(push_constant) uniform Push {
    uint byte_offset; // where the range starts inside binding 0; multiple of 4
    uint n_bytes;     // length of the range
    uint word_base;   // global index of the range's first word
    uint out_index;   // which pair of sums to add into
} p;

uint fmix32(uint h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

void main() {
    uint n_words = (p.n_bytes + 3u) / 4u;
    uint first = p.byte_offset / 4u;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint tail = p.n_bytes & 3u;
    uint a = 0u;
    uint b = 0u;
    for (uint k = gl_GlobalInvocationID.x; k < n_words; k += stride) {
        uint w = words[first + k];
        if (tail != 0u && k == n_words - 1u) {
            w &= (1u << (8u * tail)) - 1u;
        }
        uint i = p.word_base + k;
        a += fmix32(w ^ (i * 0x9E3779B9u));
        b += fmix32((w + i * 0x85EBCA6Bu) ^ 0xC2B2AE35u);
    }
    a = subgroupAdd(a);
    b = subgroupAdd(b);
    if (subgroupElect()) {
        atomicAdd(sums[2u * p.out_index], a);
        atomicAdd(sums[2u * p.out_index + 1u], b);
    }
}
