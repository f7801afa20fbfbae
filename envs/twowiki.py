"""AgentR1/2WikiMultiHopQA-v0: multi-hop questions from 2WikiMultiHopQA, answered with a search tool.

Card
----
Task
    A 2WikiMultiHopQA question (Ho et al., 2020; Apache-2.0). Types: ``compositional`` and
    ``inference`` (follow a chain: "Where was the director of film X born?"), ``comparison``
    and ``bridge_comparison`` ("Which film came out first, X or Y?"). Two or four supporting
    paragraphs (``supporting_titles``). Gold answers come with aliases where the release has
    them (``id_aliases.json``); scoring takes the max over the answer and its aliases.
Tools
    ``search(query)``: top-``topk`` (3) passages with their titles, cut to
    ``max_result_tokens`` (512) tokens; optional ``lookup(title)`` (``lookup_tool=True``).
    Retriever failures are ``tool_error`` messages. See ``envs/qa.py``.
Observation
    Token ids of the conversation; ``tool_format="hermes"`` (default) or ``"search_r1"``.
Reward
    ``em`` (weight 1) by default; ``em`` and ``f1`` match 2WikiMultihopQA's official
    ``2wikimultihop_evaluate_v1.1.py`` exactly (HotpotQA's rules, max over the answer, its
    aliases and demonyms). ``answer_metric="f1"`` or ``"substring"`` (hackable, opt-in only). Format, ``call_ok``,
    ``call_invalid`` and ``supporting_hit`` (first retrieval of each supporting paragraph) are
    0 by default and set through ``rewards=``; see ``envs/qa.py``.
Data
    Read: ``dev.json`` (12,576 questions) or ``train.json`` of the official release, in its
    layout (``_id, type, question, context, supporting_facts, evidences, answer``) with the
    aliases file beside it, or the normalized JSONL. Default corpus: the split's own context
    paragraphs (``corpus_path`` or ``retriever=`` for others).
Getting the data
    With no ``data_path`` the env downloads the official ``data_ids_april7.zip`` (the Dropbox
    link of the 2WikiMultiHopQA README) into ``$AGENT_GYM_CACHE`` and extracts ``dev.json`` and
    ``id_aliases.json``. Offline, fetch it elsewhere and pass ``data_path=`` (the file or its
    directory; the aliases file is read from the same directory).
Versions
    v0: first release.
"""

from __future__ import annotations

from envs.qa import MultiHopQAEnv


class TwoWikiMultiHopQAEnv(MultiHopQAEnv):
    dataset = "2wikimultihopqa"
    env_id = "AgentR1/2WikiMultiHopQA-v0"
