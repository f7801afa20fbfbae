"""The code envs' verdict harness: what runs inside the two sandboxes of one verdict.

This file is shipped, whole, as the first part of both sandboxed programs (so it must use the
standard library only, and it holds nothing secret), and imported by ``envs/code.py`` for its data
codec. The design (``envs/code.py``'s card, docs/sandbox.md "Verdicts"):

- the *answer sandbox* runs the answer's code, then calls its functions on a list of calls (name,
  arguments as data) and replies with each call's result as data (:func:`encode`) or the name of
  the exception it raised. It never sees a test or an expected value;
- the *tests sandbox* runs only trusted code (the task's tests, its prompt or setup code, and its
  reference solution) with the answer's functions replaced by :class:`Proxy` objects that replay
  the answer sandbox's results (decoded into fresh plain values), and replies with the verdict.

Data are plain values only: None, bool, int, float, complex, str, bytes, list, tuple, set,
frozenset, dict (instances of their subclasses are converted to the base type, so an ``int``
subclass whose ``__eq__`` is always true arrives as its integer value), and iterators (a
generator, ``map``...), delivered as an iterator over their items. Anything else is not data: a
result that is not data can only be passed back into the answer's own functions (a :class:`Ref`);
any other use of it (``==``, ``bool``, attributes, hashing, iteration) raises ``TypeError``.
"""

import builtins
import posix  # os without its import cost (os is not loaded under -S): the sandbox is Linux

MAX_DEPTH = 64  # nesting of one value (its Python literal stays under the parser's 200 brackets)
MAX_ITEMS = 1_000_000  # items taken from one iterator


class NotData(Exception):
    """A value that cannot cross between the sandboxes as data."""


class Ref:
    """In the tests sandbox: the answer's result of call ``k`` that was not data."""

    __slots__ = ("k",)

    def __init__(self, k):
        object.__setattr__(self, "k", k)

    def _refuse(self, *args, **kwargs):
        raise TypeError(
            f"the answer's result of call #{self.k} is not data (a plain value: None, bool, int, "
            f"float, complex, str, bytes, list, tuple, set, frozenset, dict); it can only be "
            f"passed back to the answer's functions"
        )

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __iter__ = _refuse
    __hash__ = __contains__ = __getitem__ = __call__ = __int__ = __float__ = __index__ = _refuse

    def __getattr__(self, name):
        self._refuse()

    def __repr__(self):
        return f"<the answer's non-data result of call #{self.k}>"


def encode(x, refs=None, depth=0):
    """``x`` as JSON-ready data, or ``NotData``. ``refs`` maps ``id(obj)`` to a call index for the
    objects to send as references (the tests sandbox's own non-data results); a :class:`Ref` is
    always sent as a reference."""
    if depth > MAX_DEPTH:
        raise NotData(f"nested more than {MAX_DEPTH} deep")
    if x is None or x is True or x is False:
        return x
    if type(x) is Ref:
        return ["r", x.k]
    if refs is not None and id(x) in refs:
        return ["r", refs[id(x)]]
    d = depth + 1
    if isinstance(x, bool):
        return bool.__bool__(x)
    if isinstance(x, int):
        return ["i", hex(int.__index__(x))]
    if isinstance(x, float):
        return ["f", float.hex(x)]
    if isinstance(x, complex):
        return ["c", float.hex(complex.__complex__(x).real), float.hex(complex.__complex__(x).imag)]
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, (bytes, bytearray)):
        return ["b", bytes(x).hex()]
    for base, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if isinstance(x, base):
            return [tag, [encode(v, refs, d) for v in base.__iter__(x)]]
    if isinstance(x, dict):
        return ["d", [[encode(k, refs, d), encode(v, refs, d)] for k, v in dict.items(x)]]
    if hasattr(type(x), "__next__") and hasattr(type(x), "__iter__"):  # a generator, map, filter, zip...
        items = []
        for v in x:
            if len(items) >= MAX_ITEMS:
                raise NotData(f"an iterator of more than {MAX_ITEMS} items")
            items.append(encode(v, refs, d))
        return ["it", items]
    raise NotData(f"a {type(x).__module__}.{type(x).__qualname__}")


def decode(v, ref=None, depth=0):
    """The plain value that :func:`encode` made ``v`` from; ``ValueError`` (or ``TypeError`` for an
    unhashable set item or dict key) for anything else. ``ref(k)``, when given, resolves a
    reference; without it a reference is refused."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    if v is None or type(v) is bool or type(v) is str:
        return v
    if type(v) is not list or not v or type(v[0]) is not str:
        raise ValueError(f"not an encoded value: {str(v)[:80]}")
    tag, rest, d = v[0], v[1:], depth + 1
    if tag in ("i", "f", "b") and len(rest) == 1 and type(rest[0]) is str:
        return int(rest[0], 16) if tag == "i" else float.fromhex(rest[0]) if tag == "f" else bytes.fromhex(rest[0])
    if tag == "c" and len(rest) == 2 and all(type(p) is str for p in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag in ("l", "t", "S", "F", "it") and len(rest) == 1 and type(rest[0]) is list:
        items = [decode(i, ref, d) for i in rest[0]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset, "it": iter}[tag](items)
    if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
        out = {}
        for pair in rest[0]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a dict item that is not a [key, value] pair")
            out[decode(pair[0], ref, d)] = decode(pair[1], ref, d)
        return out
    if tag == "r" and ref is not None and len(rest) == 1 and type(rest[0]) is int:
        return ref(rest[0])
    raise ValueError(f"not an encoded value: {str(v)[:80]}")


def _reply(obj, literal=False):
    """Write the reply to the saved standard output (the program's own prints go to stderr): JSON,
    or (the answer sandbox, which starts faster without importing json) an ASCII Python literal."""
    if literal:
        data = ascii(obj).encode()
    else:
        import json  # deferred: the answer sandbox starts faster without json (this file runs in both sandboxes)

        data = json.dumps(obj).encode()
    while data:
        data = data[posix.write(_OUT, data) :]


def _exc_name(e):
    name = type(e).__name__
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 100 else "Exception"


def run_answer(source, calls):
    """The answer sandbox: run ``source``, then each call (``[name, args, kwargs]``, encoded);
    reply ``{"load_error", "results"}`` as a Python literal."""
    ns = {"__name__": "__main__", "__builtins__": builtins}
    load_error, results, objs = None, [], []
    try:
        exec(compile(source, "<answer>", "exec"), ns)
    except BaseException as e:  # SyntaxError, an exception, sys.exit(): the program did not run
        load_error = f"{_exc_name(e)}: {str(e)[:300]}"
    if load_error is None:
        for name, args, kwargs in calls:
            try:
                if name not in ns:
                    raise NameError(f"name {name!r} is not defined")
                a = decode(args, objs.__getitem__)
                kw = {k: decode(v, objs.__getitem__) for k, v in kwargs}
                r = ns[name](*a, **kw)
            except BaseException as e:
                objs.append(None)
                results.append(["e", _exc_name(e)])
                continue
            objs.append(r)
            try:
                results.append(["v", encode(r)])
            except BaseException:
                results.append(["r"])
    _reply({"load_error": load_error, "results": results}, literal=True)


class Proxy:
    """In the tests sandbox, one of the answer's functions: replays the answer's results for the
    calls the answer sandbox made; past the first new call, asks the reference solution."""

    def __init__(self, name, state):
        self.name, self.state = name, state
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        import json  # deferred: the tests sandbox only; the answer sandbox starts faster without json

        st, k = self.state, len(self.state["calls"])
        try:
            call = json.dumps(
                [self.name, encode(list(args), st["objs"]), [[key, encode(v, st["objs"])] for key, v in kwargs.items()]]
            )
        except NotData as e:
            st["harness_error"] = st["harness_error"] or (
                f"the tests pass {e} to {self.name}(), which cannot be sent to the answer's sandbox as data"
            )
            raise
        st["calls"].append(call)
        known = st["known"]
        if st["matched"] and k < len(known) and known[k][0] == call:
            st["outs"].append(None)
            return _known_result(known[k][1], k)
        st["matched"] = False
        fn = st["ref_ns"].get(self.name)
        import random  # deferred: the tests sandbox only; the answer sandbox starts faster without random

        saved = random.getstate()  # the reference's draws must not move the tests' random stream
        try:
            if fn is None:
                raise NameError(
                    f"the reference solution defines no {self.name!r}"
                    + (f" (it did not run: {st['ref_error']})" if st["ref_error"] else "")
                )
            r = fn(*args, **kwargs)
        except BaseException as e:
            st["outs"].append(["e", _exc_name(e)])
            raise
        finally:
            random.setstate(saved)
        try:
            st["outs"].append(["v", encode(r)])
        except NotData:
            st["objs"][id(r)] = k
            st["keep"].append(r)
            st["outs"].append(["r"])
        return r


def _known_result(res, k):
    if res[0] == "v":
        return decode(res[1])
    if res[0] == "r":
        return Ref(k)
    cls = getattr(builtins, res[1], None)
    # Not StopIteration: raised in a test's map() or next() it would end an iteration quietly.
    if (
        isinstance(cls, type)
        and issubclass(cls, Exception)
        and not issubclass(cls, (StopIteration, StopAsyncIteration))
    ):
        raise cls(f"raised by the answer on call #{k}")
    raise RuntimeError(f"the answer raised {res[1]} on call #{k}")


def run_tests(spec):
    """The tests sandbox: ``spec`` holds ``kind`` (humaneval or mbpp), ``reference`` (source),
    ``prelude`` (trusted source run first in the tests' namespace), ``tests`` (sources), ``names``
    (the answer's functions), ``entry`` (HumanEval's), ``seed`` and ``known`` ([call, result]
    pairs from the answer sandbox). Replies with the calls made, the reference's results where it
    stood in, whether every call was the answer's, and each test's outcome."""
    st = {
        "calls": [],
        "outs": [],
        "matched": True,
        "known": spec["known"],
        "objs": {},
        "keep": [],
        "harness_error": None,
        "ref_error": None,
        "ref_ns": {"__name__": "__reference__"},
    }
    try:
        exec(compile(spec["reference"], "<reference>", "exec"), st["ref_ns"])
    except BaseException as e:
        st["ref_error"] = f"{_exc_name(e)}: {str(e)[:300]}"
    import random  # deferred: the tests sandbox only; the answer sandbox starts faster without random

    random.seed(spec["seed"])
    ns = {"__name__": "__main__"}
    exec(compile(spec["prelude"], "<prelude>", "exec"), ns)
    for name in spec["names"]:
        ns[name] = Proxy(name, st)
    passed, why = [], None
    tests = spec["tests"]
    if spec["kind"] == "humaneval":
        exec(compile(tests[0], "<test>", "exec"), ns)
        tests = ["check(%s)" % spec["entry"]]
    for i, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {i}>", "exec"), ns)
            passed.append(True)
        except BaseException as e:
            passed.append(False)
            why = why or f"test {i} ({test.strip()[:120]}) failed: {_exc_name(e)}: {str(e)[:200]}"
    _reply(
        {
            "calls": st["calls"],
            "outs": st["outs"],
            "matched": st["matched"],
            "passed": passed,
            "why": why,
            "harness_error": st["harness_error"],
            "reference_error": st["ref_error"],
        }
    )


if __name__ == "__main__":  # only ever run as the sandbox's program (fed on stdin): see envs/code.py
    _OUT = posix.dup(1)
    posix.dup2(2, 1)  # whatever the answer, the reference or the tests print goes to stderr
