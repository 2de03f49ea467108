"""The embedded toy world: procedural "<color> <shape>" images, a tiny pretrained text-to-image
diffusion model (diffusers ``UNet2DConditionModel`` + ``DDIMScheduler`` config), a tiny text
encoder with an offline word-level tokenizer, and a tiny classifier used as the toy feature network
(``fd_toy``, ``is_toy``, ``lpips_toy``). See docs/toy-world.md for the model card.
"""
