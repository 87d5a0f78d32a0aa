"""Model geometry beyond the preset table: Hugging Face ``config.json`` files (:mod:`.hf`), preset
name lookup (:mod:`.names`) and tensor/pipeline parallel layouts (:mod:`.parallel`).
See docs/models.md."""
