"""benchmarks/analysis/qa_answers.py on hand-made trajectories and rows: right answers, yes/no,
gold in the retrieved passages, answers that are a span of the question or hold a tool call, and right answers by the
row's question type, against counts worked by hand."""

import json

from benchmarks.analysis.qa_answers import answer_counts


def test_counts_by_hand(tmp_path):
    rows = [
        {"question": "Which film came out first, Jaws or Alien?", "answer": "Jaws", "type": "comparison"},
        {"question": "Who directed the film Jaws?", "answer": "Steven Spielberg", "type": "compositional"},
        {"question": "Are Jaws and Alien both films?", "answer": "yes", "type": "comparison"},
        {"question": "Where was the director of Alien born?", "answer": "South Shields", "aliases": ["Shields"]},
    ]
    eps = [
        # right, a span of the question, the gold in the passages
        {"task_index": 0, "answer": "Jaws", "text": "<tool_response>Doc 1 (Title: Jaws) Jaws (1975)</tool_response>"},
        # wrong, a span of the question ("the film jaws" normalizes to "film jaws"), gold retrieved
        {"task_index": 1, "answer": "The film Jaws", "text": "<tool_response>by Steven Spielberg</tool_response>"},
        # right yes/no, "yes" not in the question
        {"task_index": 2, "answer": "Yes", "text": "no call"},
        # no answer: counted in rows and retrieval, nothing else
        {"task_index": 3, "answer": None, "text": "<tool_response>born in South Shields</tool_response>"},
        # right by an alias; "shields" is not a word of the question ("Alien" is, but not this answer)
        {"task_index": 3, "answer": "Shields", "text": ""},
        # a part of a word is not a span: "lie" is inside "Alien" but no word of the question
        {"task_index": 0, "answer": "lie", "text": ""},
        # a retrieved passage's title (with its parentheses), not a span of the question
        {"task_index": 1, "answer": "Alien (film)", "text": "Doc 1 (Title: Alien (film)) Alien is a film."},
        # a title's first word is not the title
        {"task_index": 1, "answer": "Ridley", "text": "Doc 1 (Title: Ridley Scott) Ridley Scott is a director."},
        # a call written into the answer slot (F1 pays its query's words), and a text that only names a name
        {"task_index": 0, "answer": '[{"name": "search", "arguments": {"query": "Jaws or Alien"}}]', "text": ""},
        {"task_index": 0, "answer": 'the "name" of the film', "text": ""},
        # a user's own call syntax, which only the env's record knows holds a call
        {"task_index": 0, "answer": "!search Jaws", "answer_holds_call": True, "text": ""},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    c = answer_counts(str(tmp_path / "t.jsonl"), str(tmp_path / "rows.jsonl"))
    assert c["episodes"] == 11 and c["answered"] == 10 and c["right"] == 3
    assert c["answer_holds_call"] == 2
    assert c["yes_no_questions"] == 1 and c["right_yes_no"] == 1 and c["answered_yes"] == 1
    assert c["gold_retrieved"] == 3 and c["right_when_retrieved"] == 1
    assert c["answer_from_question"] == 2 and c["answer_is_retrieved_title"] == 2  # Jaws, Alien (film)
    assert (c["rows[comparison]"], c["right[comparison]"]) == (6, 2)
    assert (c["rows[compositional]"], c["right[compositional]"]) == (3, 0)
    assert (c["rows[untyped]"], c["right[untyped]"]) == (2, 1)


def test_the_search_side_by_hand(tmp_path):
    rows = [
        {
            "question": "Who directed Jaws, and where was he born?",
            "answer": "Cincinnati",
            "type": "bridge",
            "supporting_titles": ["Jaws (film)", "Steven Spielberg"],
        },
        {"question": "Is Jaws a film?", "answer": "yes"},  # no supporting titles: not in those counts
    ]
    jaws = "Doc 1 (Title: Jaws (film)) Jaws is a 1975 film."
    both = jaws + " Doc 2 (Title: Steven Spielberg) born in Cincinnati."
    q = 'search({"query": "Jaws"})'
    eps = [
        # the same query twice: repeated; one of the two supporting paragraphs
        {"task_index": 0, "answer": "x", "text": jaws, "step_calls": [[q], [q]]},
        # a second hop: both paragraphs, nothing repeated
        {"task_index": 0, "answer": "x", "text": both, "step_calls": [[q], ['search({"query": "Spielberg"})']]},
        # no call recorded, nothing retrieved
        {"task_index": 0, "answer": None, "text": ""},
        # a repeat in one turn; the row has no supporting titles
        {"task_index": 1, "answer": "yes", "text": both, "step_calls": [[q, q]]},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    c = answer_counts(str(tmp_path / "t.jsonl"), str(tmp_path / "rows.jsonl"))
    assert c["query_repeated"] == 2
    assert c["rows_with_supporting"] == 3
    assert (c["supporting_all_retrieved"], c["supporting_some_retrieved"]) == (1, 2)
