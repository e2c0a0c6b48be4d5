"""CARE training: independent initialisation, Stage I query alignment, Stage II joint fine-tuning."""
