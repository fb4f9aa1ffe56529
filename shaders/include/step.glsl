// The per-step parameter buffer, written by the host before each submit (so a decode
// command buffer can be recorded once and replayed). Rust twin: engine::kernels::StepParams
// (header) followed by the rope frequency table and the token ids.
//   uint pos0;            position of the batch's first token
//   uint kv0;             KV-cache row of position 0 (slot s of a multi-slot session: s * ctx)
//   uint pad[2];
//   float freqs[128];     rope: theta_i = pos * freqs[i], freqs[i] = base^(-2i/head_dim)
//   uint tokens[];        token ids of the batch
#define STEP_FREQS_MAX 128u
#define STEP_BUFFER(BINDING)                                                              \
    layout(std430, set = 0, binding = BINDING) readonly buffer Step {                      \
        uint step_pos0;                                                                    \
        uint step_kv0;                                                                     \
        uint step_pad1;                                                                    \
        uint step_pad2;                                                                    \
        float step_freqs[STEP_FREQS_MAX];                                                  \
        uint step_tokens[];                                                                \
    };
