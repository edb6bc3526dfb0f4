"""Pydantic models of the training job configs (``config/training/*.yaml``).

One YAML file describes one job: which model (``encoder`` or ``vlm``), its architecture, the optimisation
and data settings, and how the job is launched (local / Kubernetes / SageMaker). The deployment-wide
choice of launcher lives in the pipeline config (``schemas.config.TrainingConfig``); :func:`effective_launch`
merges the two (the pipeline's non-default values win).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError


class TrainingConfigError(ReasonCodedError, ValueError):
    """A training config file that is missing, not YAML, or does not validate."""

    default_reason = "training_config_invalid"
    message_format = "{message}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BackboneConfig(_Strict):
    """2D backbone applied to every image (and to every sampled slice of a volume).

    ``vit``: a transformers ``ViTModel`` built from a ``ViTConfig`` (Dosovitskiy et al. 2021); tokens are
    its last hidden states (CLS + patches). ``resnet``: a small ResNet with basic blocks (He et al. 2016);
    tokens are the cells of its last feature map.
    """

    kind: Literal["vit", "resnet", "pretrained"] = "vit"
    path: str | None = Field(
        default=None,
        description="local folder of a transformers vision checkpoint (ViT, DINOv2, Swin, SigLIP vision: "
        "AutoModel + AutoImageProcessor, local_files_only); sets kind=pretrained, its hidden size wins",
    )
    image_size: int = Field(default=32, ge=8, description="input side in pixels (images are resized to it)")
    in_channels: Literal[1, 3] = 1
    patch_size: int = Field(default=8, ge=1, description="vit only")
    hidden_size: int = Field(default=64, ge=8, description="token width (vit hidden size / resnet last width)")
    num_layers: int = Field(default=2, ge=1, description="vit encoder layers")
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=128, ge=8, description="vit MLP width")
    resnet_widths: list[int] = Field(default=[16, 32, 64], min_length=1, description="channels per resnet stage")

    @model_validator(mode="before")
    @classmethod
    def _path_means_pretrained(cls, data):
        if isinstance(data, dict) and data.get("path"):
            data = {**data, "kind": "pretrained"}
        return data

    @model_validator(mode="after")
    def _check(self) -> BackboneConfig:
        if self.kind == "pretrained":
            if not self.path:
                raise ValueError("backbone.kind=pretrained needs backbone.path")
            return self
        if self.kind == "vit" and self.image_size % self.patch_size:
            raise ValueError("backbone.image_size must be a multiple of backbone.patch_size")
        if self.hidden_size % self.num_heads:
            raise ValueError("backbone.hidden_size must be a multiple of backbone.num_heads")
        if self.kind == "resnet" and self.resnet_widths[-1] != self.hidden_size:
            raise ValueError("backbone.resnet_widths[-1] must equal backbone.hidden_size")
        return self


class LoRAConfig(_Strict):
    """LoRA adapters (Hu et al. 2021, arXiv:2106.09685) through ``peft``: only the adapters train."""

    r: int = Field(default=8, ge=1, description="adapter rank")
    alpha: int = Field(default=16, ge=1, description="scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "query", "key", "value", "c_attn", "qkv"],
        min_length=1,
        description="module name suffixes that get adapters (those present in the model are used)",
    )


class EncoderModelConfig(_Strict):
    """Entity-aware image encoder (MedReCo): backbone, slice aggregation, entity pooling, heads."""

    backbone: BackboneConfig = BackboneConfig()
    max_slices: int = Field(default=8, ge=1, description="slices sampled evenly from a volume (3D variant)")
    patch_depth: int = Field(
        default=1,
        ge=1,
        description="backbone.kind vit: slices per 3D patch (tubelet) of a volume, a Conv3d patch embedding with "
        "kernel (patch_depth, patch_size, patch_size); 2D images are tubelets of repeated copies; 1: every slice "
        "through the 2D patch embedding",
    )
    embed_dim: int = Field(default=32, ge=4, description="retrieval embedding size")
    pool_heads: int = Field(default=4, ge=1, description="heads of the entity-conditioned attention pooling")
    modality_heads: bool = Field(default=True, description="one projection head per modality (else shared)")
    temperature: float = Field(default=0.07, gt=0, description="initial InfoNCE temperature (learned per modality)")
    entity_text_encoder: str | None = Field(
        default=None,
        description="local folder of a transformers text encoder (e.g. all-MiniLM-L6-v2): entity "
        "queries start from mean-pooled embeddings of the entity names (randomly projected to the token width)",
    )
    freeze_backbone: bool = Field(default=False, description="keep the backbone's weights fixed (no gradient)")
    lora: LoRAConfig | None = Field(
        default=None, description="LoRA adapters on the backbone (peft); base weights frozen"
    )
    gradient_checkpointing: bool = Field(default=False, description="recompute backbone activations in backward")
    window: dict[str, tuple[float, float]] = Field(
        default={"CT": (40.0, 400.0)},
        description="per modality: (centre, width) intensity window (CT: HU); other volumes min-max scaled",
    )
    slice_spacing_mm: float | None = Field(default=None, gt=0, description="resample volumes to this slice spacing")

    @model_validator(mode="after")
    def _check(self) -> EncoderModelConfig:
        if self.patch_depth > 1 and self.backbone.kind != "vit":
            raise ValueError(f"patch_depth {self.patch_depth} needs backbone.kind vit (got {self.backbone.kind})")
        return self


class OptimConfig(_Strict):
    """Optimisation and loop settings shared by both jobs."""

    max_steps: int = Field(default=40, ge=1, description="optimizer steps in total (a resume continues the count)")
    batch_size: int = Field(default=8, ge=2, description="micro-batch per process")
    grad_accum_steps: int = Field(default=1, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_steps: int = Field(default=0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    seed: int = 0
    num_workers: int = Field(default=0, ge=0, description="DataLoader workers per process")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto", description="auto: bf16 autocast on CUDA, fp32 elsewhere"
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    checkpoint_every: int = Field(default=20, ge=1, description="steps between checkpoints (and one at the end)")
    log_every: int = Field(default=1, ge=1)
    eval_every: int | None = Field(default=None, ge=1, description="steps between evaluations (None: at the end only)")
    best_metric: str | None = Field(
        default=None,
        description="dotted path into the evaluation (e.g. val.cells_mean.NDCG@10 or "
        "val.mc_accuracy): the checkpoint with its highest value is kept as checkpoints/best.pt",
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp", description="several processes: DistributedDataParallel or FSDP2 fully_shard"
    )


class EncoderDataConfig(_Strict):
    """Which positives and splits the encoder job uses."""

    loss: Literal["graded", "infonce"] = Field(
        default="graded",
        description="graded: multi-positive contrastive loss with targets weighted by the "
        "retrieval_targets relevance; infonce: one positive per query, relevant in-batch items masked",
    )
    gather_negatives: bool = Field(default=True, description="all-gather embeddings across processes as negatives")
    positive_states: list[Literal["present", "absent", "uncertain"]] = Field(
        default=["present"],
        min_length=1,
        description="study_labels states that make two studies relevant (fallback when retrieval_targets is absent)",
    )
    eval_splits: list[str] = Field(default=["val", "test", "external_test"], min_length=1)
    recall_ks: list[int] = Field(default=[1, 5, 10], min_length=1)
    ndcg_k: int = Field(default=10, ge=1)


class TokenizerConfig(_Strict):
    """Tokenizer trained offline on the snapshot's VQA texts (``tokenizers`` WordLevel), or a local one."""

    kind: Literal["auto", "word", "local"] = Field(
        default="auto", description="auto: the language model folder's own tokenizer when lm.path is set, else word"
    )
    path: str | None = Field(default=None, description="kind=local: folder with a saved tokenizer")
    min_frequency: int = Field(default=1, ge=1)
    lowercase: bool = True


class LanguageModelConfig(_Strict):
    """The causal language model: built from a GPT-2 / Llama config, or loaded from a local folder."""

    kind: Literal["gpt2", "llama", "local"] = "gpt2"
    path: str | None = Field(default=None, description="kind=local: save_pretrained folder (no hub downloads)")
    hidden_size: int = Field(default=64, ge=8)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=128, ge=8)
    max_positions: int = Field(default=256, ge=16)

    @model_validator(mode="before")
    @classmethod
    def _path_means_local(cls, data):
        if isinstance(data, dict) and data.get("path"):
            data = {**data, "kind": "local"}
        return data

    @model_validator(mode="after")
    def _check(self) -> LanguageModelConfig:
        if self.kind == "local" and not self.path:
            raise ValueError("lm.kind=local needs lm.path")
        return self


class VLMModelConfig(_Strict):
    """Comparative VLM (MedReCo-VLM): vision encoder + projector + causal LM, or a local Qwen2-VL/Qwen2.5-VL."""

    path: str | None = Field(
        default=None,
        description="local Qwen2-VL / Qwen2.5-VL folder as released (weights, tokenizer files, "
        "image processor config, chat template): trained as is, vision/lm/tokenizer settings unused",
    )
    vision_init: str | None = Field(
        default=None,
        description="where the vision tower's backbone, slice and entity-pool weights start: an encoder "
        "checkpoint path (checkpoints/last.pt or best.pt of an encoder job), or encoder, encoder:best, "
        "encoder:last, encoder/NAME[:best|:last]: the encoder job of the same snapshot (training.vision_init; "
        "the training DAG then runs the VLM after the encoder)",
    )
    freeze_vision: bool = Field(default=False, description="keep the vision tower fixed")
    freeze_lm: bool = Field(default=False, description="keep the language model fixed (projector still trains)")
    lora: LoRAConfig | None = Field(default=None, description="LoRA adapters on the language model (peft)")
    gradient_checkpointing: bool = Field(default=False, description="recompute LM/vision activations in backward")
    vision: EncoderModelConfig = EncoderModelConfig()
    visual_tokens: int = Field(default=4, ge=1, description="tokens per image after the resampler")
    lm: LanguageModelConfig = LanguageModelConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    max_text_tokens: int = Field(default=96, ge=8)
    max_new_tokens: int = Field(default=8, ge=1, description="greedy decoding length for open answers")

    @model_validator(mode="after")
    def _check(self) -> VLMModelConfig:
        if self.path and self.vision_init:
            raise ValueError("model.vision_init starts the built vision tower; a Qwen-VL model.path has its own")
        return self


class VLMDataConfig(_Strict):
    """Which answer formats are trained and which splits are evaluated."""

    formats: list[Literal["mc", "open"]] = Field(default=["mc", "open"], min_length=1)
    eval_splits: list[str] = Field(default=["val", "test", "external_test"], min_length=1)
    max_eval_items: int | None = Field(default=None, ge=1, description="cap per split (None: all)")


class KubernetesConfig(_Strict):
    """batch/v1 Job settings."""

    namespace: str = "medreco"
    image: str = "medreco-db-train:latest"
    service_account: str | None = None
    cpu: str = "8"
    memory: str = "64Gi"
    gpus: int = Field(default=1, ge=0)
    node_selector: dict[str, str] = {}
    data_pvc: str = Field(default="medreco-data", description="PVC holding the storage root")
    data_mount: str = "/data"
    output_pvc: str = "medreco-models"
    output_mount: str = "/models"
    shm_size: str = Field(default="16Gi", description="/dev/shm for DataLoader workers")
    backoff_limit: int = Field(default=2, ge=0)
    ttl_seconds_after_finished: int = Field(default=86400, ge=0)


class SageMakerConfig(_Strict):
    """CreateTrainingJob settings (bring-your-own container)."""

    region: str = "us-east-1"
    role_arn: str = "arn:aws:iam::123456789012:role/medreco-sagemaker"
    image_uri: str = "123456789012.dkr.ecr.us-east-1.amazonaws.com/medreco-db-train:latest"
    instance_type: str = "ml.g5.2xlarge"
    instance_count: int = Field(default=1, ge=1)
    volume_size_gb: int = Field(default=100, ge=1)
    max_runtime_s: int = Field(default=86400, ge=60)
    storage_root: str = Field(
        default="s3://medreco-db", description="the pipeline's S3 storage root (holds snapshots/)"
    )
    output_s3_uri: str = "s3://medreco-db/models"


class LaunchConfig(_Strict):
    """How the job is started. ``nproc_per_node`` > 1 runs under torchrun (DDP)."""

    launcher: Literal["local", "kubernetes", "sagemaker"] = "local"
    nproc_per_node: int = Field(default=1, ge=1)
    timeout_s: int = Field(default=3600, ge=1, description="local launcher: subprocess timeout")
    kubernetes: KubernetesConfig = KubernetesConfig()
    sagemaker: SageMakerConfig = SageMakerConfig()


class _JobBase(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$", description="run name (DNS-1123 label)")
    optim: OptimConfig = OptimConfig()
    launch: LaunchConfig = LaunchConfig()
    output_dir: str | None = Field(
        default=None, description="checkpoint root; default <storage root>/models (local roots only)"
    )


class EncoderJobConfig(_JobBase):
    """One entity-aware encoder training job."""

    job: Literal["encoder"] = "encoder"
    model: EncoderModelConfig = EncoderModelConfig()
    data: EncoderDataConfig = EncoderDataConfig()


class VLMJobConfig(_JobBase):
    """One comparative VLM training job."""

    job: Literal["vlm"] = "vlm"
    model: VLMModelConfig = VLMModelConfig()
    data: VLMDataConfig = VLMDataConfig()


JobConfig = EncoderJobConfig | VLMJobConfig


def load_job_config(path: str | Path, expect: str | None = None) -> JobConfig:
    """Read and validate a training job YAML file.

    Parameters
    ----------
    path : str or Path
        the YAML file; its ``job`` key (``encoder`` | ``vlm``) picks the model.
    expect : str, optional
        refuse a file of another job kind.

    Raises
    ------
    TrainingConfigError
        missing file, invalid YAML, validation errors, or a job kind other than ``expect``.
    """
    p = Path(path)
    if not p.is_file():
        raise TrainingConfigError(f"training config not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise TrainingConfigError(f"{p}: invalid YAML: {err}") from None
    if not isinstance(data, dict):
        raise TrainingConfigError(f"{p}: expected a mapping")
    kind = data.get("job")
    model = {"encoder": EncoderJobConfig, "vlm": VLMJobConfig}.get(kind)
    if model is None:
        raise TrainingConfigError(f"{p}: job must be 'encoder' or 'vlm', got {kind!r}")
    if expect and kind != expect:
        raise TrainingConfigError(f"{p}: is a {kind} config, a {expect} config was expected")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise TrainingConfigError(f"{p}: {err}") from None


def effective_launch(job: JobConfig, pipeline_training=None, launcher: str | None = None) -> LaunchConfig:
    """The job's launch settings with the deployment's choices applied.

    Precedence: ``launcher`` (command line) > the pipeline's ``training.launcher`` > the job file. The
    pipeline's ``image``, ``namespace`` and ``gpus`` replace the job file's Kubernetes values when set
    (``image`` not null, ``gpus`` > 0).

    Parameters
    ----------
    job : EncoderJobConfig or VLMJobConfig
    pipeline_training : schemas.config.TrainingConfig, optional
    launcher : str, optional
        ``local`` | ``kubernetes`` | ``sagemaker``.
    """
    launch = job.launch
    k8s = launch.kubernetes
    chosen = launch.launcher
    if pipeline_training is not None:
        if pipeline_training.launcher != "none":
            chosen = pipeline_training.launcher
        updates = {"namespace": pipeline_training.namespace}
        if pipeline_training.image:
            updates["image"] = pipeline_training.image
        if pipeline_training.gpus:
            updates["gpus"] = pipeline_training.gpus
        k8s = k8s.model_copy(update=updates)
    if launcher:
        chosen = launcher
    return launch.model_copy(update={"launcher": chosen, "kubernetes": k8s})


def resolve_job_config(path: str, base_dir: str | Path) -> Path:
    """A job config path: absolute as is; relative from the pipeline config's folder, else the project root.

    Raises
    ------
    FileNotFoundError
        when neither location holds the file.
    """
    p = Path(path)
    for cand in [p] if p.is_absolute() else [Path(base_dir) / p, PROJECT_ROOT / p]:
        if cand.is_file():
            return cand.resolve()
    raise FileNotFoundError(f"training config {path} not found (looked under {base_dir} and {PROJECT_ROOT})")
