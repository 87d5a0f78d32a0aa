"""A running serving engine beside the simulator (issue 22, items 3-4): vLLM driven in-process.

* :mod:`kvsim.realengine.vllm_engine` -- build vLLM's in-process ``LLMEngine`` from a local
  ``config.json`` (dummy weights, no tokenizer, prompts as token ids) and watch each step's
  schedule (:class:`~kvsim.realengine.vllm_engine.StepProbe`);
* :mod:`kvsim.realengine.tokens` -- a trace's prompts as token ids (prefix structure kept);
* :mod:`kvsim.realengine.calibrate` -- ``kvsim calibrate --engine vllm``: step times over a grid,
  written as a calibration directory (docs/calibration.md, "Calibrating against a running engine");
* :mod:`kvsim.realengine.replay` -- ``kvsim replay --engine vllm``: a scenario's trace run through
  the engine in real time, written as ``kvsim run`` writes a run (docs/replay.md);
* :mod:`kvsim.realengine.probe` -- ``python -m kvsim.realengine.probe``: one fixed reference step on a
  fresh engine, timed to see how the host's speed drifts (docs/replay.md, "Host drift").

vLLM is imported only inside functions that run the engine: nothing here needs it to be imported.
"""
