"""Real-model weights: :mod:`.backends` (the table), :mod:`.locate` (the resolver), :mod:`.commands`."""
