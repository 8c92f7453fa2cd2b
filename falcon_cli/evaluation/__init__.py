"""Evaluation: retrieval recall (ITC and ITM re-ranking, zero-shot, ECCV Caption and multi-positive metrics),
VQA and NLVR2 accuracy."""
