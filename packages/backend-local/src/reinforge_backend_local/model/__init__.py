"""The model and the machine it runs on, shared by every stage.

Finding and loading the model (``modeling``), its LoRA adapter (``weights``), frozen weights in oneDNN's
packed layout (``packing``), the one thread that does a process's tensor work (``compute``), malloc's
arenas and trimming (``memory``), checkpoints (``checkpoint``) and a run folder's versions
(``run_versions``, plain JSON: the online gateway reads it without torch).
"""
