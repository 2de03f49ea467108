"""Applications over the toy world: pretraining the toy models, their checks, and their commands."""
