"""AgentR1/MuSiQue-v0: 2- to 4-hop questions from MuSiQue-Ans, answered with a search tool.

Card
----
Task
    A MuSiQue-Ans v1.0 question (Trivedi et al., 2022; CC BY 4.0), composed from 2 to 4
    single-hop questions (``type`` is the hop pattern: ``2hop``, ``3hop1``, ..., ``4hop3``), so
    each hop needs its own retrieval. The supporting paragraphs (``supporting_titles``) are
    those marked ``is_supporting``; answers come with aliases. MuSiQue titles are not unique
    (several paragraphs of one article share its title): ``supporting_hit`` matches by title, and
    ``lookup(title)`` returns every paragraph with that title.
Tools
    ``search(query)``: top-``topk`` (3) passages with their titles, cut to
    ``max_result_tokens`` (512) tokens; optional ``lookup(title)`` (``lookup_tool=True``).
    Retriever failures are ``tool_error`` messages. See ``envs/qa.py``.
Observation
    Token ids of the conversation; ``tool_format="hermes"`` (default) or ``"search_r1"``.
Reward
    ``em`` (weight 1) by default; ``em`` and ``f1`` match MuSiQue's official
    ``metrics/answer.py`` exactly (SQuAD 2.0 F1: no yes/no rule, so ``f1("no city",
    ["Norway", "no"])`` is 2/3; an empty side gives 1 only if both are empty), max over answer
    and aliases. ``answer_metric="f1"`` or ``"substring"`` (hackable, opt-in only). Format, ``call_ok``,
    ``call_invalid`` and ``supporting_hit`` are 0 by default and set through ``rewards=``; see
    ``envs/qa.py``.
Data
    Read: ``musique_ans_v1.0_dev.jsonl`` (2,417 questions, 20 paragraphs each) or
    ``musique_ans_v1.0_train.jsonl`` in the official layout, or the normalized JSONL. Default
    corpus: the split's own paragraphs (``corpus_path`` or ``retriever=`` for others).
Getting the data
    With no ``data_path`` the env downloads ``musique_v1.0.zip`` (the Google Drive link of the
    MuSiQue README) into ``$AGENT_GYM_CACHE`` and extracts the split's file. Offline, fetch it
    elsewhere and pass ``data_path=`` (the file or its directory).
Versions
    v0: first release.
"""

from __future__ import annotations

from envs.qa import MultiHopQAEnv


class MuSiQueEnv(MultiHopQAEnv):
    dataset = "musique"
    env_id = "AgentR1/MuSiQue-v0"
