// The per-step parameter buffer, written by the host before each submit (so a decode
// command buffer can be recorded once and replayed). Rust twin: engine::kernels::StepParams
// (header) followed by the rope frequency table and the token ids.
//   uint pos0;            position of the batch's first token
//   uint pad[3];
//   float freqs[128];     rope: theta_i = pos * freqs[i], freqs[i] = base^(-2i/head_dim)
//   uint tokens[B];       token ids of the batch (B = STEP_MAX_BATCH)
//   uint pos[B];          each token's position (STEP_POS: a batch may mix slots)
//   uint row[B];          each token's KV-cache row (STEP_ROW: its slot's first row + pos)
#define STEP_FREQS_MAX 128u
#define STEP_MAX_BATCH 64u
#define STEP_POS(t) step_tokens[STEP_MAX_BATCH + (t)]
#define STEP_ROW(t) step_tokens[2u * STEP_MAX_BATCH + (t)]
#define STEP_BUFFER(BINDING)                                                              \
    layout(std430, set = 0, binding = BINDING) readonly buffer Step {                      \
        uint step_pos0;                                                                    \
        uint step_pad0;                                                                    \
        uint step_pad1;                                                                    \
        uint step_pad2;                                                                    \
        float step_freqs[STEP_FREQS_MAX];                                                  \
        uint step_tokens[];                                                                \
    };
