"""A VLM judge: a Qwen2-VL-style chat model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) asked to rate each image,
run through transformers on the generator pool (where every reward model lives).

Score (why not parse generated text): the judge is asked for one digit from 0 to ``max_digit``;
the reward is the *expected* digit under the model's next-token distribution restricted to the digit
tokens, ``sum_d d * softmax(logits[d])``, read from one forward pass at the answer position. That is
deterministic (no sampling), never unparseable (a random-weight or chatty model still yields a number),
continuous (finer than an integer grade, which GRPO's group normalisation needs to rank samples) and
batched (one forward per micro-batch, no generation loop). Scores lie in [0, max_digit].

Inputs are built without transformers' multimodal ``Processor`` (which needs torchvision for its video
half): the tokenizer, the Qwen2-VL image processor and the checkpoint's config are enough. The chat
markup is Qwen's (``<|im_start|>role ... <|im_end|>``) with one ``<|vision_start|><|image_pad|>...
<|vision_end|>`` block, the image pad repeated once per merged vision patch, as the Qwen processors do.
Weights are read offline only (``local_files_only``); docs/rewards.md shows how to point it at a
real checkpoint.
"""

from __future__ import annotations

import inspect
import os

import torch

from .base import MissingRewardWeightsError, Reward, require, to_pil
from .external import _looks_local, default_device

#: what the judge is asked (``{prompt}`` is the generation prompt); reward.kwargs.question replaces it
DEFAULT_QUESTION = (
    "You are judging a generated image. The image was generated for the prompt: \"{prompt}\". "
    "Rate how well the image matches the prompt and how good it looks, as a single digit from 0 (worst) "
    "to {max_digit} (best). Answer with the digit only."
)
DEFAULT_SYSTEM = "You are a helpful assistant."
IMAGE_BLOCK = "<|vision_start|>{pads}<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"


def chat_text(question: str, pads: str, system: str | None) -> str:
    """One judge request in Qwen's chat markup, ending where the assistant's answer starts."""
    sys_part = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return (f"{sys_part}<|im_start|>user\n{IMAGE_BLOCK.format(pads=pads)}{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


class VLMJudge(Reward):
    """Expected rating (0..``max_digit``) of a chat VLM asked ``question`` about each image.

    ``model_path``: a local checkpoint directory or a hub id in the local HF cache (required);
    ``question``: the scoring prompt, formatted with ``{prompt}`` and ``{max_digit}``; ``system``: the
    system message (None: none); ``max_digit``: highest digit (1..9); ``dtype``: the model's weights
    dtype; ``device``: default CUDA when present; ``max_pixels``: image size cap handed to the image
    processor (None: the checkpoint's).
    """

    name = "vlm_judge"

    def __init__(self, model_path: str | None = None, question: str = DEFAULT_QUESTION,
                 system: str | None = DEFAULT_SYSTEM, max_digit: int = 9, dtype: str = "float32",
                 device: str | None = None, max_pixels: int | None = None, cache_dir: str | None = None) -> None:
        if not model_path:
            raise ValueError("reward 'vlm_judge' needs reward.kwargs.model_path: a Qwen2-VL-style checkpoint "
                             "(a local directory or a hub id in the local cache)")
        if not (isinstance(max_digit, int) and 1 <= max_digit <= 9):
            raise ValueError(f"reward 'vlm_judge': max_digit must be an integer in [1, 9], got {max_digit!r}")
        try:
            question.format(prompt="p", max_digit=max_digit)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"reward 'vlm_judge': question may use only {{prompt}} and {{max_digit}} "
                             f"(got {question!r}: {err!r})") from None
        tf = require("transformers", "transformers", self.name)
        if _looks_local(model_path) and not os.path.isdir(os.path.expanduser(model_path)):
            raise MissingRewardWeightsError(f"reward 'vlm_judge': local checkpoint directory {model_path!r} "
                                            "does not exist")
        self.question, self.system, self.max_digit = question, system, max_digit
        self.device = default_device(device)
        path = os.path.expanduser(model_path)
        opts = dict(local_files_only=True, cache_dir=cache_dir)
        try:
            self.tokenizer = tf.AutoTokenizer.from_pretrained(path, **opts)
            self.image_processor = tf.Qwen2VLImageProcessor.from_pretrained(path, **opts)
            self.model = tf.AutoModelForImageTextToText.from_pretrained(
                path, dtype=getattr(torch, dtype), **opts).to(self.device).eval().requires_grad_(False)
        except (OSError, ValueError) as err:
            raise MissingRewardWeightsError(
                f"reward 'vlm_judge' needs {model_path!r} (tokenizer, preprocessor_config.json and weights), which "
                f"is not on this machine and is not downloaded at run time. Fetch it beforehand "
                f"(`huggingface-cli download {model_path}`) or pass a local directory ({err})") from err
        if max_pixels is not None:
            self.image_processor.max_pixels = int(max_pixels)
            if hasattr(self.image_processor, "size") and isinstance(self.image_processor.size, dict):
                self.image_processor.size = {**self.image_processor.size, "longest_edge": int(max_pixels)}
        self.tokenizer.padding_side = "left"  # the answer position is the last one of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.digit_ids = []
        for d in range(max_digit + 1):
            ids = self.tokenizer.encode(str(d), add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"reward 'vlm_judge': the digit {d} is not one token for {model_path!r} ({ids})")
            self.digit_ids.append(ids[0])
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        merge = getattr(self.image_processor, "merge_size", 2)
        self.merge_area = int(merge) ** 2
        self._mm_types = "mm_token_type_ids" in inspect.signature(self.model.forward).parameters

    @torch.no_grad()
    def digit_probs(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """(N, max_digit + 1) float64: the judge's next-token distribution over the digits."""
        pil = to_pil(images)
        vision = self.image_processor(images=pil, return_tensors="pt")
        grid = vision["image_grid_thw"]
        texts = [chat_text(self.question.format(prompt=p, max_digit=self.max_digit),
                           IMAGE_PAD * (int(g.prod()) // self.merge_area), self.system) for p, g in zip(prompts, grid)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        inputs = {**enc, **vision}
        if self._mm_types:  # transformers >= 5: which tokens are image tokens, for multimodal RoPE
            inputs["mm_token_type_ids"] = (enc["input_ids"] == self.image_token_id).to(torch.int)
        dtype = next(self.model.parameters()).dtype
        inputs = {k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device))
                  for k, v in inputs.items()}
        logits = self.model(**inputs).logits[:, -1, :]
        return torch.softmax(logits[:, self.digit_ids].to(torch.float64), dim=-1)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        probs = self.digit_probs(images, prompts)
        digits = torch.arange(self.max_digit + 1, dtype=torch.float64, device=probs.device)
        return probs @ digits

    def __repr__(self) -> str:
        return f"VLMJudge({type(self.model).__name__}, max_digit={self.max_digit})"

