// Push constants of matmul.comp. Rust twin: engine::kernels::MatmulPush (104 bytes).
// A dispatch covers up to three weight "views" (q/k/v, or gate/up) laid end to end in
// workgroup x: view v owns workgroups [tiles[v-1], tiles[v]) (tiles[-1] = 0).
layout(push_constant) uniform Push {
    uint n_tok;    // tokens in the batch
    uint x_tok0;   // first token row of X that is read (the last prompt token for logits)
    uint ncols;    // row length of every view, a multiple of 64
    uint x_ld;     // floats between token rows of X and XR
    uint out_ld;   // floats between token rows of out0
    uint kv_ld;    // elements between positions in the caches (OUT_QKV)
    uint head_dim; // (OUT_QKV)
    float eps;     // rmsnorm epsilon (IN_RMSNORM)
    uvec4 tiles;   // cumulative workgroup ends of views 0, 1, 2
    uvec4 nrows;   // rows of each view
    uvec4 wofs;    // word offset of each view's first row inside its binding
    uvec4 orow;    // global row index of each view's first row (row-range parts)
    uint aux_ofs;  // float offset of the next norm weight inside the aux binding (OUT_ADD)
    uint write_xg; // OUT_ADD: also write out1 = (x + Y) * aux, the next rmsnorm's input
} pc;
