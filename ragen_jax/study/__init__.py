"""Studies of SNR-Aware Filtering and the collapse diagnostics at demo scale, from one shared warm start."""
