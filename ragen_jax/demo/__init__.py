"""The CPU demo: a tiny model learns the grid puzzles (SFT warm start, then RL with SNR filtering)."""
