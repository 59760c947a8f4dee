"""Training irregularity localization: trace readers (pure parsing) and analysis (pure)."""
