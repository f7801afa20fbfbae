"""AgentR1/HotpotQA-v0: multi-hop questions from HotpotQA, answered with a search tool.

Card
----
Task
    A HotpotQA question (Yang et al., 2018; CC BY-SA 4.0): ``bridge`` questions ("In which town
    was the director of X born?") need two paragraphs in sequence, ``comparison`` questions
    ("Who was born earlier, A or B?") need two paragraphs side by side; yes/no answers occur.
    Every question has exactly two supporting paragraphs (``supporting_titles``).
Tools
    ``search(query)``: top-``topk`` (3) passages with their titles, cut to
    ``max_result_tokens`` (512) tokens; optional ``lookup(title)`` (``lookup_tool=True``).
    Retriever failures are ``tool_error`` messages. See ``envs/qa.py``.
Observation
    Token ids of the conversation (system prompt with tool schemas, question, assistant turns,
    tool responses); ``tool_format="hermes"`` (default) or ``"search_r1"``.
Reward
    ``em`` (weight 1) by default; ``em`` and ``f1`` match HotpotQA's official
    ``hotpot_evaluate_v1.py``: normalized equality, F1 with the yes/no/noanswer rule; except that
    a gold normalizing to "" (e.g. ``!!!``) matches no answer, where the script gives an empty
    answer EM 1. HotpotQA has no
    aliases. ``answer_metric="f1"`` or ``"substring"`` (hackable, opt-in only). Format,
    ``call_ok``, ``call_invalid`` and ``supporting_hit`` (the first retrieval of each of the two
    supporting paragraphs) are 0 by default and set through ``rewards=``; see ``envs/qa.py``.
Data
    Read: the distractor-setting dev file ``hotpot_dev_distractor_v1.json`` (7,405 questions,
    10 paragraphs each) or the training file ``hotpot_train_v1.1.json`` (``split="train"``), in
    the official layout, the Hugging Face ``hotpot_qa`` export or the project's normalized
    JSONL. The default corpus is the deduplicated context paragraphs of the loaded split (the
    distractor pool, about 66k paragraphs for the full dev set); pass ``corpus_path`` for
    another one (e.g. wiki-18), or ``retriever="http://host:port"`` for a retrieval server.
Getting the data
    ``gym.make("AgentR1/HotpotQA-v0")`` downloads the dev file from
    http://curtis.ml.cmu.edu/datasets/hotpot/ into ``$AGENT_GYM_CACHE`` (``~/.cache/agent_gym``)
    on first use. Offline, fetch it elsewhere and pass
    ``data_path="hotpot_dev_distractor_v1.json"`` (a file or its directory).
Versions
    v0: first release.
"""

from __future__ import annotations

from envs.qa import MultiHopQAEnv


class HotpotQAEnv(MultiHopQAEnv):
    dataset = "hotpotqa"
    env_id = "AgentR1/HotpotQA-v0"
