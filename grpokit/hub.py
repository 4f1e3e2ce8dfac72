"""Upload to the Hugging Face Hub: TRL's ``push_to_hub`` / ``hub_model_id`` /
``hub_strategy`` / ``hub_private_repo`` / ``hub_token``, with transformers' meanings.

- ``end``: the final model (``OUTPUT_DIR/final``) once, when training ends;
- ``every_save``: also the model (weights, config, tokenizer) of each checkpoint, at the repo
  root, when the checkpoint is written;
- ``checkpoint``: as every_save, plus the whole latest checkpoint (optimizer, scheduler, RNG
  and trainer state too) in ``last-checkpoint/``, to resume from elsewhere;
- ``all_checkpoints``: as every_save, plus each whole checkpoint in ``checkpoint-N/``.

Everything that can fail before training does (:meth:`HubUpload.check`: a token, the hub
reachable, the token accepted, the repository created or present), so a run never learns at
its end that its model cannot be uploaded. Uploads run in the main process, synchronously,
with ``huggingface_hub.HfApi`` (``HF_ENDPOINT`` as it is when the run starts).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("grpokit")

# what of a checkpoint is "the model" (transformers pushes the saved model, not its state)
_STATE_FILES = ["optimizer.pt", "scheduler.pt", "rng.pt", "ref_model.pt", "trainer_state.json"]


class HubError(RuntimeError):
    """The hub cannot take this run's uploads; the message names the cause and the fix."""


class HubUpload:
    def __init__(self, repo_id: str, *, strategy: str, private: bool, token: str | None):
        from huggingface_hub import HfApi

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
        self.strategy, self.private = strategy, private
        endpoint = os.environ.get("HF_ENDPOINT") or None
        self.api = HfApi(endpoint=endpoint, token=token)
        self.endpoint = self.api.endpoint
        self.repo_id = repo_id

    def check(self) -> str:
        """Before training: the token, the hub, the repository. Returns the repository id
        (with the user's namespace when ``hub_model_id`` had none)."""
        from huggingface_hub.constants import HF_HUB_OFFLINE

        if HF_HUB_OFFLINE:
            raise HubError("push_to_hub with HF_HUB_OFFLINE set: unset it, or push_to_hub: false")
        if not self.api.token and not _stored_token():
            raise HubError(
                "push_to_hub needs a Hugging Face token with write access: set HF_TOKEN, "
                "hub_token, or run `hf auth login` (or set push_to_hub: false)"
            )
        try:
            user = self.api.whoami()
        except Exception as e:  # connection refused, DNS, timeout, 401: all one message
            raise HubError(
                f"push_to_hub: the hub at {self.endpoint} did not accept the token "
                f"({_short(e)}); check the network, HF_ENDPOINT and the token, or set "
                "push_to_hub: false"
            ) from e
        if "/" not in self.repo_id:
            self.repo_id = f"{user['name']}/{self.repo_id}"
        try:
            self.api.create_repo(self.repo_id, private=self.private, exist_ok=True)
        except Exception as e:
            raise HubError(
                f"push_to_hub: cannot create or use {self.repo_id} at {self.endpoint} "
                f"({_short(e)}); check hub_model_id and that the token may write there"
            ) from e
        return self.repo_id

    def after_save(self, checkpoint: Path, step: int) -> None:
        """A checkpoint was written: upload what ``hub_strategy`` asks for."""
        if self.strategy == "end":
            return
        self._upload(checkpoint, "", f"step {step}", ignore=_STATE_FILES)
        if self.strategy == "checkpoint":
            self._upload(checkpoint, "last-checkpoint", f"step {step}: checkpoint")
        elif self.strategy == "all_checkpoints":
            self._upload(checkpoint, checkpoint.name, f"step {step}: checkpoint")

    def at_end(self, final: Path) -> str:
        """The final model, at the repo root; its address."""
        self._upload(final, "", "end of training")
        return f"{self.endpoint}/{self.repo_id}"

    def _upload(self, folder: Path, at: str, message: str, ignore=None) -> None:
        log.info("uploading %s to %s/%s", folder, self.repo_id, at)
        self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=str(folder),
            path_in_repo=at,
            commit_message=f"grpokit: {message}",
            ignore_patterns=ignore,
        )


def _stored_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _short(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def hub_for(cfg) -> HubUpload | None:
    """The run's uploader when ``push_to_hub`` is on (checked before training), else None."""
    if not cfg.push_to_hub:
        return None
    repo = cfg.hub_model_id or Path(cfg.output_dir).resolve().name
    up = HubUpload(repo, strategy=cfg.hub_strategy, private=cfg.hub_private_repo,
                   token=cfg.hub_token)  # fmt: skip
    up.check()
    log.info("push_to_hub: %s (hub_strategy %s)", up.repo_id, cfg.hub_strategy)
    return up
