"""Evaluation: retrieval recall (and later FN-aware metrics, VQA and NLVR2 accuracy)."""
