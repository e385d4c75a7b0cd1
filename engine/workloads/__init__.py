"""Traffic in one vocabulary: the bundled chat prompts and length laws (``canonical``), live
Poisson traffic (``traffic``) and prompts that share prefixes (``prefix``).
"""
