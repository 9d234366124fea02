"""The small models scripts/hf_check.py checks, one [model] table each, and what each can run."""

# Small models with distinct sizes and head_dim 64 (the GPU's flash attention path); windows
# shorter than the sequences so they matter; RoPE bases and eps other than the defaults so a
# mapping mistake shows.
FAMILIES = {
    "gpt2": """
family = "gpt2"
vocab_size = 257
hidden_size = 192
num_layers = 2
num_heads = 3
ffn_hidden_size = 400
norm_eps = 1e-5
max_position_embeddings = 80
""",
    "llama": """
family = "llama"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 448
rope_theta = 50000.0
norm_eps = 1e-6
""",
    "mistral": """
family = "mistral"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 1
ffn_hidden_size = 384
sliding_window = 24
rope_theta = 500000.0
""",
    "qwen2": """
family = "qwen2"
vocab_size = 257
hidden_size = 256
num_layers = 3
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 320
sliding_window = 20
rope_theta = 1000000.0
tie_embeddings = true
""",
    # q/k norms, and head_dim x num_heads (256) != hidden_size (192) as in Qwen3-0.6B.
    "qwen3": """
family = "qwen3"
vocab_size = 257
hidden_size = 192
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 64
ffn_hidden_size = 320
rope_theta = 200000.0
norm_eps = 1e-5
tie_embeddings = true
""",
    "mixtral": """
family = "mixtral"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 192
num_experts = 4
experts_per_token = 2
moe_aux_loss_coef = 0.02
rope_theta = 100000.0
""",
    # RoPE scaling: original_max_position_embeddings 32 against sequences of up to 120 tokens;
    # llama3's smooth band and yarn's ramp cover a few of the 32 pairs of head_dim 64. yarn:
    # max_position_embeddings = factor x original (transformers versions that derive the factor
    # from their ratio agree then), attention_factor and truncate other than the defaults.
    "llama-linear": """
family = "llama"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 448
rope_theta = 50000.0
max_position_embeddings = 128
[model.rope_scaling]
type = "linear"
factor = 2.5
""",
    "llama-llama3": """
family = "llama"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 448
rope_theta = 50000.0
max_position_embeddings = 128
[model.rope_scaling]
type = "llama3"
factor = 8.0
low_freq_factor = 1.0
high_freq_factor = 4.0
original_max_position_embeddings = 32
""",
    "llama-yarn": """
family = "llama"
vocab_size = 257
hidden_size = 256
num_layers = 2
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 448
rope_theta = 10000.0
max_position_embeddings = 128
[model.rope_scaling]
type = "yarn"
factor = 4.0
original_max_position_embeddings = 32
beta_fast = 16.0
beta_slow = 2.0
attention_factor = 1.2
truncate = false
""",
    # Sparse and dense layers (exported as mlp_only_layers [1]), routed experts smaller than the
    # dense MLP, a shared expert of a third size, the top-k weights not renormalised.
    "qwen2_moe": """
family = "qwen2_moe"
vocab_size = 257
hidden_size = 256
num_layers = 3
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 320
hybrid_layout = "EAE"
num_experts = 4
experts_per_token = 2
moe_ffn_hidden_size = 96
moe_shared_expert_ffn_size = 160
moe_norm_topk_prob = false
moe_aux_loss_coef = 0.02
rope_theta = 100000.0
""",
    # Qwen3's attention (q/k norms, head_dim 48 x 4 heads != hidden 256) with renormalised experts
    # of their own size and a dense layer (mlp_only_layers [1]), no shared expert.
    "qwen3_moe": """
family = "qwen3_moe"
vocab_size = 257
hidden_size = 256
num_layers = 3
num_heads = 4
num_kv_heads = 2
head_dim = 48
ffn_hidden_size = 320
hybrid_layout = "EAE"
num_experts = 4
experts_per_token = 2
moe_ffn_hidden_size = 96
moe_aux_loss_coef = 0.02
rope_theta = 100000.0
""",
    "mamba": """
family = "mamba"
vocab_size = 257
hidden_size = 192
num_layers = 2
mamba_d_state = 8
mamba_d_conv = 4
mamba_expand = 2
norm_eps = 1e-6
""",
    "mamba2": """
family = "mamba2"
vocab_size = 257
hidden_size = 128
num_layers = 2
mamba_expand = 2
mamba_head_dim = 32
mamba_n_groups = 2
mamba_d_state = 16
mamba_d_conv = 4
mamba_dt_limit_min = 0.001
norm_eps = 1e-6
""",
}

# Families whose blocks have no CUDA kernels yet (the run plan refuses them on the GPU; none now),
# and those text generation does not take (none now).
CPU_ONLY = set()
NO_GENERATE = set()
