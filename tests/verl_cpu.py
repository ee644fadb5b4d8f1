"""verl 0.9.1's FSDP TrainingWorker on a CPU: the workarounds, each with the verl line it answers.

For tests/engines (verl_runs.py) only (run in a subprocess). Not part of rlgates: verl supports
CUDA and NPU; this makes its single-process FSDP engine run on gloo with a tiny model. The TRL
shim (rlgates.trainers._verl_compat) is separate and applied by the caller.
"""

from __future__ import annotations

import os
import socket
import types

import torch


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _cpu_module():
    # torch.cpu lacks the memory queries verl calls on its device module
    # (verl/workers/engine_workers.py ~227, _postprocess_output: max_memory_allocated/reserved).
    m = types.SimpleNamespace(**{k: getattr(torch.cpu, k) for k in dir(torch.cpu) if not k.startswith("_")})
    m.max_memory_allocated = lambda *a, **k: 0
    m.max_memory_reserved = lambda *a, **k: 0
    m.memory_allocated = lambda *a, **k: 0
    m.memory_reserved = lambda *a, **k: 0
    m.empty_cache = lambda: None
    # verl/utils/profiler/performance.py ~54 (_get_current_mem_info, logged by the FSDP engine's
    # _build_model_optimizer): mem_get_info.
    m.mem_get_info = lambda *a, **k: (0, 1)
    # verl/utils/flops_counter.py ~80 (get_device_flops, for the MFU metric of train_mini_batch).
    m.get_device_name = lambda *a, **k: "CPU"
    m.set_device = lambda *a, **k: None
    m.manual_seed = torch.manual_seed
    m.manual_seed_all = torch.manual_seed
    m.is_available = lambda: True
    return m


def setup() -> None:
    """Call before importing verl.workers.engine_workers (and before verl resolves its platform)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    # verl/workers/engine/base.py ~405 (EngineRegistry.new): the FSDP engines are registered for
    # devices ["cuda", "npu"] only (verl/workers/engine/fsdp/transformer_impl.py ~1143); this
    # picks the "cuda" registration while the platform below says cpu.
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"

    import torch.distributed as dist

    # verl/utils/distributed.py ~89 (initialize_global_process_group_ray, called by TrainingWorker
    # .__init__): the backend is hard-coded "cpu:gloo,<device>:nccl"; a group that is already
    # initialised is kept, so we start a gloo-only one first (rank and size from the environment,
    # as torchrun or Ray set them).
    if not dist.is_initialized():
        dist.init_process_group("gloo")

    # verl/plugin/platform/platform_manager.py (_detect_platform_name): no CPU platform; without an
    # accelerator it falls back to "nvidia" and torch.cuda.set_device fails in init_device_mesh
    # (verl/workers/engine/fsdp/utils.py ~48). A platform whose device is "cpu", picked by
    # VERL_PLATFORM.
    from verl.plugin.platform import platform_manager as pm
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    cpu = _cpu_module()

    @pm.PlatformRegistry.register(platform="rlgates_cpu")
    class PlatformCPU(PlatformCUDA):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu

        def is_available(self):
            return True

        def is_platform_available(self, use_smi_check=False):
            return True

        # verl/utils/device.py ~120 (get_device_id = current_device) feeds .to(...) and
        # torch.device(...) across the FSDP engine (verl/utils/fsdp_utils.py ~507,
        # verl/workers/engine/fsdp/transformer_impl.py ~730, ~1552): an int means an accelerator.
        def current_device(self):
            return torch.device("cpu")

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def empty_cache(self):
            pass

        def communication_backend_name(self):
            return "gloo"

    os.environ["VERL_PLATFORM"] = "rlgates_cpu"
    pm._current_platform = None


def tiny_model_dir(path: str, vocab: int = 33, seed: int = 0) -> str:
    """A one-layer LlamaForCausalLM and a word-level tokenizer saved under `path` (no hub)."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab - 1)}
    words["<unk>"] = vocab - 1
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<unk>")),
                                  unk_token="<unk>", pad_token="t0", eos_token="t1", bos_token="t2")
    tok.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def worker(path: str, lr: float = 1e-3, clip_grad: float = 1.0):
    """verl's TrainingWorker (FSDP, language model) on the CPU for the model saved at `path`."""
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.config.engine import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker

    # verl/workers/config/model.py (HFModelConfig): flash-attention and remove-padding (flash-attn
    # varlen kernels) are the defaults; eager attention and padded batches on a CPU.
    mc = HFModelConfig(path=path, override_config={"attn_implementation": "eager"},
                       use_remove_padding=False, enable_gradient_checkpointing=False)
    # verl/workers/config/engine.py (FSDPEngineConfig): bf16 params by default; fp32 on a CPU,
    # and no torch.compile (inductor needs a compiler toolchain and minutes on 2 cores).
    ec = FSDPEngineConfig(strategy="fsdp2", use_torch_compile=False,
                          mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32",
                                           "buffer_dtype": "fp32"})
    # verl/workers/engine/utils.py ~111 (prepare_micro_batches): dynamic batch size needs a
    # token budget; fixed micro-batches of 2 instead (the actor worker sets these from its config).
    ec.use_dynamic_bsz = False
    ec.micro_batch_size_per_gpu = 2
    oc = FSDPOptimizerConfig(lr=lr, clip_grad=clip_grad)
    return TrainingWorker(TrainingWorkerConfig(model_type="language_model", model_config=mc,
                                               engine_config=ec, optimizer_config=oc))

