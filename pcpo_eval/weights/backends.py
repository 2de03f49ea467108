"""The BACKENDS table: every set of real weights pcpo-eval can use, and where to look for it.

Covers every model the paper's ten setups and its evaluation need: the base pipelines (SD-1.4,
SD-1.5 under its current hub id ``stable-diffusion-v1-5/stable-diffusion-v1-5`` with the retired
``runwayml/...`` id only as an extra cache location, SD3.5-Medium, FLUX.1-dev), the feature nets
(Inception, DINOv2, AlexNet for LPIPS), the preference models (HPSv2.1 / v2.0, PickScore, CLIP,
aesthetic MLP, ImageReward), the OCR engines (PaddleOCR det / rec / cls, TrOCR) and the BERTScore
reward's captioners (the paper's Qwen2.5-VL-3B-Instruct, ddpo-pytorch's LLaVA-1.5) and scorer
(roberta-large, bert-score's English default). See docs/weights.md.
"""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["file", "dir"]


@dataclass(frozen=True)
class Backend:
    """A set of weights pcpo-eval can use, and where to look for it.

    ``kind == "file"``: a single weights file named ``filename``. ``kind == "dir"``: a folder (a
    Hugging Face ``save_pretrained`` layout) recognised by the marker file ``filename`` inside it.
    ``hf_repos`` are hub repositories whose cached snapshot holds ``filename``; ``torch_hub`` are
    paths relative to ``torch.hub.get_dir()``; ``extra`` are absolute paths (``~`` expanded, ``{tmp}``
    = the system temp dir) where reference packages cache the same file.
    """

    name: str
    description: str
    kind: Kind
    filename: str
    env_var: str
    obtain: str
    used_by: str
    hf_repos: tuple[str, ...] = ()
    torch_hub: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    cache_name: str | None = None  # name under $PCPO_WEIGHTS_DIR (default: filename or backend name)
    notes: tuple[str, ...] = field(default_factory=tuple)


def _hf_obtain(repo: str, files: str | None = None) -> str:
    what = f"{repo} {files}" if files else repo
    return f"on a machine with internet: `hf download {what}`, then copy the HF cache here (or point the variable at it)"


#: Every backend pcpo-eval knows, by name. Feature nets first, then preference models, then pipelines.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in [
        Backend(
            name="inception",
            description="Inception-v3 for FID/IS (NVIDIA TorchScript or torch-fidelity's converted TF weights)",
            kind="file",
            filename="inception-2015-12-05.pt",
            env_var="PCPO_INCEPTION_WEIGHTS",
            torch_hub=(
                "checkpoints/weights-inception-2015-12-05-6726825d.pth",
                "checkpoints/pt_inception-2015-12-05-6726825d.pth",
            ),
            extra=("{tmp}/inception-2015-12-05.pt",),
            obtain=(
                "download nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt "
                "(clean-fid) or torch-fidelity's weights-inception-2015-12-05-6726825d.pth release asset"
            ),
            used_by="metrics: fid, is (extractor 'inception')",
        ),
        Backend(
            name="dinov2",
            description="DINOv2 ViT-L/14 for FD-DINOv2 (transformers folder of facebook/dinov2-large)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_DINOV2_PATH",
            hf_repos=("facebook/dinov2-large",),
            cache_name="dinov2-large",
            obtain=_hf_obtain("facebook/dinov2-large"),
            used_by="metrics: fd_dinov2 (extractor 'dinov2')",
        ),
        Backend(
            name="lpips_alex",
            description="torchvision AlexNet trunk for LPIPS v0.1 (the linear layers ship in the lpips wheel)",
            kind="file",
            filename="alexnet-owt-7be5be79.pth",
            env_var="PCPO_ALEXNET_WEIGHTS",
            torch_hub=("checkpoints/alexnet-owt-7be5be79.pth",),
            obtain="download.pytorch.org/models/alexnet-owt-7be5be79.pth into TORCH_HOME/hub/checkpoints/",
            used_by="metrics: lpips",
        ),
        Backend(
            name="hps",
            description="HPSv2.1 (OpenCLIP ViT-H-14 fine-tuned), HPS_v2.1_compressed.pt",
            kind="file",
            filename="HPS_v2.1_compressed.pt",
            env_var="PCPO_HPS_WEIGHTS",
            hf_repos=("xswu/HPSv2",),
            extra=("~/.cache/hpsv2/HPS_v2.1_compressed.pt",),
            obtain=_hf_obtain("xswu/HPSv2", "HPS_v2.1_compressed.pt"),
            used_by="reward/metric 'hps'",
        ),
        Backend(
            name="hps_v20",
            description="HPSv2.0 (for the paper's DPO-comparison table), HPS_v2_compressed.pt",
            kind="file",
            filename="HPS_v2_compressed.pt",
            env_var="PCPO_HPS_V20_WEIGHTS",
            hf_repos=("xswu/HPSv2",),
            extra=("~/.cache/hpsv2/HPS_v2_compressed.pt",),
            obtain=_hf_obtain("xswu/HPSv2", "HPS_v2_compressed.pt"),
            used_by="reward/metric 'hps_v20' (= 'hps' with version='v2.0')",
        ),
        Backend(
            name="pickscore",
            description="PickScore_v1 CLIP-H model (transformers folder)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_PICKSCORE_PATH",
            hf_repos=("yuvalkirstain/PickScore_v1",),
            cache_name="PickScore_v1",
            obtain=_hf_obtain("yuvalkirstain/PickScore_v1"),
            used_by="reward/metric 'pickscore'",
        ),
        Backend(
            name="pickscore_processor",
            description="PickScore's processor/tokenizer: laion/CLIP-ViT-H-14-laion2B-s32B-b79K (configs only)",
            kind="dir",
            filename="preprocessor_config.json",
            env_var="PCPO_PICKSCORE_PROCESSOR_PATH",
            hf_repos=("laion/CLIP-ViT-H-14-laion2B-s32B-b79K",),
            cache_name="CLIP-ViT-H-14-laion2B-s32B-b79K",
            obtain=_hf_obtain(
                "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                "preprocessor_config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.json merges.txt",
            ),
            used_by="reward/metric 'pickscore'",
        ),
        Backend(
            name="imagereward",
            description="ImageReward-v1.0 BLIP reward model, ImageReward.pt (needs the 'preference' extra)",
            kind="file",
            filename="ImageReward.pt",
            env_var="PCPO_IMAGEREWARD_WEIGHTS",
            hf_repos=("THUDM/ImageReward",),
            extra=("~/.cache/ImageReward/ImageReward.pt",),
            obtain=_hf_obtain("THUDM/ImageReward", "ImageReward.pt med_config.json"),
            used_by="reward/metric 'imagereward'",
        ),
        Backend(
            name="imagereward_med_config",
            description="ImageReward's BLIP text-encoder config, med_config.json",
            kind="file",
            filename="med_config.json",
            env_var="PCPO_IMAGEREWARD_MED_CONFIG",
            hf_repos=("THUDM/ImageReward",),
            extra=("~/.cache/ImageReward/med_config.json",),
            obtain=_hf_obtain("THUDM/ImageReward", "med_config.json"),
            used_by="reward/metric 'imagereward' (also found next to ImageReward.pt)",
        ),
        Backend(
            name="bert_base_uncased",
            description="bert-base-uncased tokenizer files for ImageReward's BLIP (vocab.txt + configs)",
            kind="dir",
            filename="vocab.txt",
            env_var="PCPO_BERT_TOKENIZER_PATH",
            hf_repos=("google-bert/bert-base-uncased", "bert-base-uncased"),
            cache_name="bert-base-uncased",
            obtain=_hf_obtain("google-bert/bert-base-uncased", "vocab.txt tokenizer_config.json tokenizer.json config.json"),
            used_by="reward/metric 'imagereward'",
        ),
        Backend(
            name="clip_vit_l14",
            description="OpenAI CLIP ViT-L/14 (transformers folder), the aesthetic predictor's embedding net",
            kind="dir",
            filename="config.json",
            env_var="PCPO_CLIP_L14_PATH",
            hf_repos=("openai/clip-vit-large-patch14",),
            cache_name="clip-vit-large-patch14",
            obtain=_hf_obtain("openai/clip-vit-large-patch14"),
            used_by="reward/metric 'aesthetic' (and 'clipscore' by default)",
        ),
        Backend(
            name="aesthetic",
            description="LAION improved aesthetic predictor MLP, sac+logos+ava1-l14-linearMSE.pth",
            kind="file",
            filename="sac+logos+ava1-l14-linearMSE.pth",
            env_var="PCPO_AESTHETIC_WEIGHTS",
            extra=("~/.cache/ImageReward/sac+logos+ava1-l14-linearMSE.pth",),
            obtain=(
                "download sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/"
                "improved-aesthetic-predictor (also in ddpo-pytorch's assets/)"
            ),
            used_by="reward/metric 'aesthetic' (with clip_vit_l14)",
        ),
        Backend(
            name="clipscore",
            description="CLIPScore backbone (transformers CLIP folder; default OpenAI CLIP ViT-L/14)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_CLIPSCORE_PATH",
            hf_repos=("openai/clip-vit-large-patch14",),
            cache_name="clip-vit-large-patch14",
            obtain=_hf_obtain("openai/clip-vit-large-patch14")
            + "; or pass backbone='open_clip:NAME' with pretrained=FILE",
            used_by="reward/metric 'clipscore'",
        ),
        Backend(
            name="trocr",
            description="TrOCR line recogniser (transformers folder, e.g. microsoft/trocr-base-printed)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_TROCR_PATH",
            hf_repos=("microsoft/trocr-base-printed",),
            cache_name="trocr-base-printed",
            obtain=_hf_obtain("microsoft/trocr-base-printed"),
            used_by="reward 'ocr' with recogniser='trocr'",
        ),
        Backend(
            name="paddleocr_det",
            description="PaddleOCR text detector inference folder (paddleocr 2.x lang='en': en_PP-OCRv3_det_infer)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_DET_DIR",
            extra=("~/.paddleocr/whl/det/en/en_PP-OCRv3_det_infer",),
            cache_name="paddleocr/det",
            obtain="on a machine with internet: run paddleocr once (it caches to ~/.paddleocr/whl/det/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr', Flow-GRPO's default)",
        ),
        Backend(
            name="paddleocr_rec",
            description="PaddleOCR text recogniser inference folder (paddleocr 2.x lang='en': en_PP-OCRv4_rec_infer)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_REC_DIR",
            extra=("~/.paddleocr/whl/rec/en/en_PP-OCRv4_rec_infer",),
            cache_name="paddleocr/rec",
            obtain="on a machine with internet: run paddleocr once (it caches to ~/.paddleocr/whl/rec/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr')",
        ),
        Backend(
            name="paddleocr_cls",
            description="PaddleOCR 2.x angle classifier folder (ch_ppocr_mobile_v2.0_cls_infer; 2.x fetches it even unused)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_CLS_DIR",
            extra=("~/.paddleocr/whl/cls/ch_ppocr_mobile_v2.0_cls_infer",),
            cache_name="paddleocr/cls",
            obtain="on a machine with internet: run paddleocr 2.x once (it caches to ~/.paddleocr/whl/cls/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr' with paddleocr 2.x)",
        ),
        Backend(
            name="sd15",
            description="Stable Diffusion 1.5 diffusers pipeline (DDPO setups)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD15_PATH",
            hf_repos=("stable-diffusion-v1-5/stable-diffusion-v1-5", "runwayml/stable-diffusion-v1-5"),
            cache_name="stable-diffusion-v1-5",
            obtain=_hf_obtain("stable-diffusion-v1-5/stable-diffusion-v1-5"),
            used_by="model adapter 'sd1' (DDPO configs)",
        ),
        Backend(
            name="sd14",
            description="Stable Diffusion 1.4 diffusers pipeline (DanceGRPO-SD setups)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD14_PATH",
            hf_repos=("CompVis/stable-diffusion-v1-4",),
            cache_name="stable-diffusion-v1-4",
            obtain=_hf_obtain("CompVis/stable-diffusion-v1-4"),
            used_by="model adapter 'sd1' (DanceGRPO-SD configs)",
        ),
        Backend(
            name="sd35_medium",
            description="Stable Diffusion 3.5 Medium diffusers pipeline (Flow-GRPO setups 8-9)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD35_PATH",
            hf_repos=("stabilityai/stable-diffusion-3.5-medium",),
            cache_name="stable-diffusion-3.5-medium",
            obtain=_hf_obtain("stabilityai/stable-diffusion-3.5-medium")
            + " (gated: accept the licence on the model page and `hf auth login` first)",
            used_by="model adapter 'sd3' (setups 8, 9)",
        ),
        Backend(
            name="flux_dev",
            description="FLUX.1-dev diffusers pipeline (DanceGRPO-FLUX setups 6 and 10)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_FLUX_PATH",
            hf_repos=("black-forest-labs/FLUX.1-dev",),
            cache_name="FLUX.1-dev",
            obtain=_hf_obtain("black-forest-labs/FLUX.1-dev")
            + " (gated: accept the licence on the model page and `hf auth login` first)",
            used_by="model adapter 'flux' (setups 6, 10)",
        ),
        Backend(
            name="qwen25_vl_3b",
            description="Qwen2.5-VL-3B-Instruct, the VLM the paper used for BERTScore instead of LLaVA (pcpo-paper.tex l.1179-1180)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_QWEN25_VL_PATH",
            hf_repos=("Qwen/Qwen2.5-VL-3B-Instruct",),
            cache_name="Qwen2.5-VL-3B-Instruct",
            obtain=_hf_obtain("Qwen/Qwen2.5-VL-3B-Instruct"),
            used_by="the captioner of reward 'vlm_bertscore' (default), as the paper's setups 3-4 used",
        ),
        Backend(
            name="llava",
            description="LLaVA-1.5-7B, ddpo-pytorch's captioner for its BERTScore reward (kvablack/LLaVA-server)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_LLAVA_PATH",
            hf_repos=("llava-hf/llava-1.5-7b-hf", "liuhaotian/llava-v1.5-7b"),
            cache_name="llava-1.5-7b-hf",
            obtain=_hf_obtain("llava-hf/llava-1.5-7b-hf") + " (original-format weights: liuhaotian/llava-v1.5-7b)",
            used_by="reward 'vlm_bertscore' with captioner=llava, as ddpo-pytorch (or behind your 'llava_bertscore' server)",
        ),
        Backend(
            name="bertscore_deberta",
            description="microsoft/deberta-xlarge-mnli, the BERTScore model of ddpo-pytorch's reward server (layer 40)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_BERTSCORE_DEBERTA_PATH",
            hf_repos=("microsoft/deberta-xlarge-mnli",),
            cache_name="deberta-xlarge-mnli",
            obtain=_hf_obtain("microsoft/deberta-xlarge-mnli"),
            used_by="reward / metric 'vlm_bertscore' (setups 3-4; kvablack/LLaVA-server's BERTScorer)",
        ),
        Backend(
            name="bertscore_roberta",
            description="roberta-large, bert-score's default model for lang='en' (layer 17); 'vlm_bertscore' with scorer=roberta",
            kind="dir",
            filename="config.json",
            env_var="PCPO_BERTSCORE_MODEL_PATH",
            hf_repos=("FacebookAI/roberta-large", "roberta-large"),
            cache_name="roberta-large",
            obtain=_hf_obtain("FacebookAI/roberta-large"),
            used_by="reward 'vlm_bertscore' with scorer=roberta (bert-score's own default)",
        ),
        Backend(
            name="sd1",
            description="any Stable Diffusion 1.x diffusers pipeline (1.5 preferred, then 1.4)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD1_PATH",
            hf_repos=(
                "stable-diffusion-v1-5/stable-diffusion-v1-5",
                "runwayml/stable-diffusion-v1-5",
                "CompVis/stable-diffusion-v1-4",
            ),
            cache_name="stable-diffusion-v1-5",
            obtain=_hf_obtain("stable-diffusion-v1-5/stable-diffusion-v1-5"),
            used_by="model adapter 'sd1'",
        ),
    ]
}
