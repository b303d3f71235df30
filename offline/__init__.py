"""Offline tools: they make things (trained models, drafters) the rest of the project loads."""
