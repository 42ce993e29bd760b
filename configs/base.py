"""Defaults of every training run: RAGEN-2's main settings (SPEC §2, §4, §6).

Other configs start from `get_config()` here and change what they need.
"""

import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "runs/base"

  c.model = ml_collections.ConfigDict()
  c.model.path = ""            # local HF directory; "" = the bundled SmolLM2-135M-Instruct
  c.model.dtype = "float32"    # compute dtype
  c.model.param_dtype = "float32"

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1, "num_devices": -1})
  # multi-process (ragen_jax.distributed): "", 0 and -1 mean "from RAGEN_COORDINATOR, RAGEN_NUM_PROCESSES and
  # RAGEN_PROCESS_ID", or with none of them set, detected by JAX (Cloud TPU, SLURM, Open MPI)
  c.distributed = ml_collections.ConfigDict({"enabled": False, "coordinator": "", "num_processes": 0,
                                             "process_id": -1})

  c.env = ml_collections.ConfigDict()
  c.env.name = "sokoban"
  c.env.params = ml_collections.ConfigDict()  # overrides of the env's default params

  c.rollout = ml_collections.ConfigDict()
  c.rollout.max_turns = 5
  c.rollout.max_new_tokens = 400
  c.rollout.max_actions_per_turn = 2
  c.rollout.max_actions_per_traj = 10
  c.rollout.format_penalty = -0.1
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.val_temperature = 0.5
  c.rollout.context_window_mode = "full"  # full | limited_multi_turn | single_turn (SPEC §2)
  c.rollout.max_context_window = 2  # turns kept by limited_multi_turn, the current one included
  c.rollout.max_model_len = 4096    # prompt + reply budget of a turn; older turns are dropped past it
  c.rollout.max_episode_len = 4096  # training sequence length of host text-environment episodes

  c.train = ml_collections.ConfigDict()
  c.train.iterations = 400
  c.train.env_groups = 8
  c.train.group_size = 16
  c.train.seed_base = 10000
  c.train.mini_batch_size = 32
  c.train.micro_batch_size = 8
  c.train.ppo_epochs = 1
  c.train.actor_lr = 1e-6
  c.train.critic_lr = 1e-5
  c.train.beta1 = 0.9
  c.train.beta2 = 0.999
  c.train.weight_decay = 0.01
  c.train.grad_clip = 1.0
  c.train.val_every = 10
  c.train.val_episodes = 512
  c.train.val_seed_start = 123
  c.train.checkpoint_every = 20
  c.train.max_to_keep = 3
  c.train.resume = False

  c.algorithm = ml_collections.ConfigDict()
  c.algorithm.preset = "ppo"   # ppo | grpo | dapo | drgrpo
  c.algorithm.clip_low = 0.2
  c.algorithm.clip_high = 0.28
  c.algorithm.dual_clip = 3.0
  c.algorithm.entropy_coef = 0.001
  c.algorithm.use_kl_loss = False
  c.algorithm.kl_coef = 0.001
  c.algorithm.kl_estimator = "low_var_kl"
  c.algorithm.gamma = 1.0
  c.algorithm.lam = 1.0
  c.algorithm.bi_level_gae = False
  c.algorithm.turn_gamma = 0.95
  c.algorithm.value_clip = 0.5

  c.filter = ml_collections.ConfigDict()
  c.filter.enabled = True
  c.filter.metric = "variance"
  c.filter.ddof = 1
  c.filter.strategy = "top_p"
  c.filter.value = 0.9
  c.filter.filter_type = "largest"
  c.filter.prob_mode = "linear"
  c.filter.include_zero = True
  c.filter.selection_eps = 0.01
  c.filter.loss_scaling = "none"

  c.diagnostics = ml_collections.ConfigDict()
  c.diagnostics.enabled = True
  c.diagnostics.compute_freq = 1
  c.diagnostics.num_samples = 64
  c.diagnostics.marginal = "paper"
  c.diagnostics.max_reasoning_tokens = 256
  c.diagnostics.grad_analysis = False
  c.diagnostics.num_buckets = 6
  c.diagnostics.bucket_mode = "quantile"
  c.diagnostics.alarm_window = 4
  c.diagnostics.alarm_drop = 0.5
  c.diagnostics.alarm_entropy_tolerance = 0.1
  c.diagnostics.alarm_min_drop = 0.1  # absolute fall of the MI z-score the alarm also needs

  c.early_stop = ml_collections.ConfigDict()
  c.early_stop.empty_filter_enabled = True
  c.early_stop.empty_filter_patience = 5
  c.early_stop.low_std_enabled = True
  c.early_stop.std_baseline_iters = 10
  c.early_stop.std_ratio = 0.1
  c.early_stop.std_window = 5
  c.early_stop.val_failure_enabled = True
  c.early_stop.val_success_floor = 0.01
  c.early_stop.val_patience = 5

  c.evaluate = ml_collections.ConfigDict({"envs": "sokoban", "k": 1})  # ragen_jax.evaluate

  c.logging = ml_collections.ConfigDict()
  c.logging.tensorboard = True
  c.logging.wandb = False
  c.logging.wandb_project = "ragen_jax"
  c.logging.progress_bar = True
  return c
