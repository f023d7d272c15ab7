"""Loaders for the learned reward models people actually run: PickScore, HPSv2, ImageReward.

Their packages are optional (``pip install verl-digen[rewards]``) and imported only when the reward is
built; weights are read offline only (``local_files_only=True``), because nothing may download at
run time. Both failures raise at construction, naming the missing package or weights, so a job
fails before it starts generating rather than at the first scoring call.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from .base import MissingRewardDependencyError, MissingRewardWeightsError, Reward, require, to_pil

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
HPSV2_REPO, HPSV2_FILE = "xswu/HPSv2", "HPS_v2.1_compressed.pt"
IMAGEREWARD_REPO, IMAGEREWARD_FILE, IMAGEREWARD_MED_CONFIG = "THUDM/ImageReward", "ImageReward.pt", "med_config.json"


def default_device(device: str | torch.device | None) -> torch.device:
    """The device a reward model runs on: the given one, else CUDA when present, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _looks_local(path: str) -> bool:
    """True for filesystem paths (absolute, ./, ../, ~ or more than one '/'), False for hub ids."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def load_pretrained(cls: Any, path: str, reward: str, cache_dir: str | None = None) -> Any:
    """``cls.from_pretrained(path)`` offline, turning "not found" into MissingRewardWeightsError."""
    if _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
        raise MissingRewardWeightsError(f"reward '{reward}': local weights directory '{path}' does not exist")
    try:
        return cls.from_pretrained(os.path.expanduser(path), local_files_only=True, cache_dir=cache_dir)
    except (OSError, ValueError) as err:
        raise MissingRewardWeightsError(
            f"reward '{reward}' needs '{path}' ({cls.__name__}), which is not on this machine and is not "
            f"downloaded at run time. Fetch it beforehand (`huggingface-cli download {path}`) into the "
            "Hugging Face cache, or pass a local directory."
        ) from err


def resolve_hub_file(path: str | None, repo_id: str, filename: str, reward: str, cache_dir: str | None = None) -> str:
    """A local weights file: ``path`` if given (must exist), else the cached ``repo_id/filename``."""
    if path is not None:
        path = os.path.expanduser(path)
        if not os.path.isfile(path):
            raise MissingRewardWeightsError(f"reward '{reward}': weights file '{path}' does not exist")
        return path
    hub = require("huggingface_hub", "huggingface_hub", reward)
    try:
        return hub.hf_hub_download(repo_id, filename, cache_dir=cache_dir, local_files_only=True)
    except Exception as err:  # the hub raises several "not cached" types across versions
        raise MissingRewardWeightsError(
            f"reward '{reward}' needs '{filename}' from the Hugging Face repo '{repo_id}', which is not in "
            f"the local cache and is not downloaded at run time. Fetch it beforehand "
            f"(`huggingface-cli download {repo_id} {filename}`) or pass its local path."
        ) from err


def _embeds(output: Any) -> torch.Tensor:
    """CLIP feature getters return a tensor (transformers 4) or a ModelOutput (transformers 5)."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class PickScore(Reward):
    """PickScore: logit_scale * cos(CLIP image embedding, CLIP text embedding) of the fine-tuned CLIP-H.

    Raw scale (about 18-24 for real images); FlowGRPO divides by 26, do that with a MultiReward weight.
    """

    name = "pickscore"

    def __init__(
        self,
        model_path: str = PICKSCORE_MODEL,
        processor_path: str = PICKSCORE_PROCESSOR,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        batch_size: int = 32,
        cache_dir: str | None = None,
    ) -> None:
        transformers = require("transformers", "transformers", self.name)
        self.device, self.dtype, self.batch_size = default_device(device), dtype, batch_size
        self.processor = load_pretrained(transformers.CLIPProcessor, processor_path, self.name, cache_dir)
        model = load_pretrained(transformers.CLIPModel, model_path, self.name, cache_dir)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        scores = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            pixels = self.processor(images=to_pil(images[chunk]), return_tensors="pt")["pixel_values"]
            text = self.processor(
                text=prompts[chunk], padding=True, truncation=True, max_length=77, return_tensors="pt"
            )
            image_emb = _embeds(self.model.get_image_features(pixel_values=pixels.to(self.device, self.dtype)))
            text_emb = _embeds(
                self.model.get_text_features(
                    input_ids=text["input_ids"].to(self.device),
                    attention_mask=text["attention_mask"].to(self.device),
                )
            )
            cosine = (F.normalize(image_emb.float(), dim=-1) * F.normalize(text_emb.float(), dim=-1)).sum(-1)
            scores.append(self.model.logit_scale.exp().float() * cosine)
        return torch.cat(scores)


def _import_open_clip(reward: str) -> ModuleType:
    """open_clip from ``open_clip_torch``, or the copy vendored inside the ``hpsv2`` package."""
    try:
        return require("open_clip", "open_clip_torch", reward)
    except MissingRewardDependencyError as err:
        try:
            return require("hpsv2.src.open_clip", "hpsv2", reward)
        except MissingRewardDependencyError:
            raise MissingRewardDependencyError(
                f"reward '{reward}' needs open_clip: `pip install open_clip_torch` (or `pip install hpsv2`, "
                "which vendors it), or `pip install verl-digen[rewards]`."
            ) from err


class HPSv2(Reward):
    """HPS v2.1: cosine between the fine-tuned OpenCLIP ViT-H-14 image and text embeddings."""

    name = "hpsv2"

    def __init__(
        self,
        checkpoint: str | None = None,
        arch: str = "ViT-H-14",
        device: str | torch.device | None = None,
        batch_size: int = 16,
        cache_dir: str | None = None,
    ) -> None:
        open_clip = _import_open_clip(self.name)
        path = resolve_hub_file(checkpoint, HPSV2_REPO, HPSV2_FILE, self.name, cache_dir)
        self.device, self.batch_size = default_device(device), batch_size
        # pretrained=None: the HPS checkpoint holds the full weights, so nothing else is fetched
        model, _, self.preprocess = open_clip.create_model_and_transforms(arch, pretrained=None)
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state.get("state_dict", state))
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = open_clip.get_tokenizer(arch)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        scores = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            pixels = torch.stack([self.preprocess(img) for img in to_pil(images[chunk])]).to(self.device)
            tokens = self.tokenizer(prompts[chunk]).to(self.device)
            image_emb = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
            text_emb = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
            scores.append((image_emb * text_emb).sum(-1))
        return torch.cat(scores)


class ImageRewardScore(Reward):
    """ImageReward (BLIP-based preference model) through the ``image-reward`` package.

    Its BLIP text side also loads the ``bert-base-uncased`` tokenizer, which must be in the local
    Hugging Face cache (set ``HF_HUB_OFFLINE=1`` to make that explicit).
    """

    name = "imagereward"

    def __init__(
        self,
        checkpoint: str | None = None,
        med_config: str | None = None,
        device: str | torch.device | None = None,
        cache_dir: str | None = None,
    ) -> None:
        package = require("ImageReward", "image-reward", self.name)
        path = resolve_hub_file(checkpoint, IMAGEREWARD_REPO, IMAGEREWARD_FILE, self.name, cache_dir)
        config = resolve_hub_file(med_config, IMAGEREWARD_REPO, IMAGEREWARD_MED_CONFIG, self.name, cache_dir)
        self.device = default_device(device)
        self.model = package.load(path, device=str(self.device), med_config=config).eval()

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        return torch.tensor(
            [float(self.model.score(prompt, image)) for prompt, image in zip(prompts, to_pil(images))],
            dtype=torch.float64,
        )
