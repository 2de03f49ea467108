"""Training: configs, objectives, advantages, checkpoints and the compact PCPO / baseline trainer."""
