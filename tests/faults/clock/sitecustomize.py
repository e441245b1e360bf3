"""Fake the wall clock of a child process of the fault suite (on its PYTHONPATH only).

``FAKE_CLOCK_OFFSET`` seconds are added to ``time.time``/``time.time_ns``
(and ``gmtime``/``localtime``/``ctime`` without an argument) and to
``datetime.datetime.now``/``utcnow``/``today``. ``datetime.datetime`` becomes
a subclass for which ``isinstance`` still accepts real datetimes (those
that C code such as psycopg2 creates). ``time.monotonic`` is untouched: it is
not a wall clock.

``FAKE_CLOCK_OFFSET_FILE`` (a path) makes the offset change while the process
runs: the seconds written in that file (0 while it is missing), read again at
most every 50 ms. A test steps a process's clock after it started, as NTP
stepping a clock would.
"""

import datetime as _datetime
import os
import time as _time

_OFFSET = float(os.environ.get("FAKE_CLOCK_OFFSET") or 0.0)
_FILE = os.environ.get("FAKE_CLOCK_OFFSET_FILE") or ""

if _FILE:
    _real_time_f, _real_time_ns_f, _mono = _time.time, _time.time_ns, _time.monotonic
    _state = [0.0, -1.0]  # offset, monotonic time it was read

    def _offset():
        now = _mono()
        if now - _state[1] > 0.05:
            _state[1] = now
            try:
                with open(_FILE) as f:
                    _state[0] = float(f.read().strip() or 0.0)
            except (OSError, ValueError):
                _state[0] = 0.0
        return _state[0]

    def _stepped_time():
        return _real_time_f() + _offset()

    def _stepped_time_ns():
        return _real_time_ns_f() + int(_offset() * 1_000_000_000)

    _time.time, _time.time_ns = _stepped_time, _stepped_time_ns

if _OFFSET:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _real_gmtime, _real_localtime, _real_ctime = _time.gmtime, _time.localtime, _time.ctime

    def time():
        return _real_time() + _OFFSET

    def time_ns():
        return _real_time_ns() + int(_OFFSET * 1_000_000_000)

    def gmtime(secs=None):
        return _real_gmtime(time() if secs is None else secs)

    def localtime(secs=None):
        return _real_localtime(time() if secs is None else secs)

    def ctime(secs=None):
        return _real_ctime(time() if secs is None else secs)

    _time.time, _time.time_ns = time, time_ns
    _time.gmtime, _time.localtime, _time.ctime = gmtime, localtime, ctime

    _Real = _datetime.datetime
    _delta = _datetime.timedelta(seconds=_OFFSET)

    class _Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, _Real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, _Real)

    class datetime(_Real, metaclass=_Meta):  # noqa: N801 (it replaces datetime.datetime)
        @classmethod
        def now(cls, tz=None):
            return _Real.now(tz) + _delta

        @classmethod
        def utcnow(cls):
            return _Real.utcnow() + _delta

        @classmethod
        def today(cls):
            return _Real.today() + _delta

    datetime.__name__ = datetime.__qualname__ = "datetime"
    datetime.__module__ = "datetime"
    _datetime.datetime = datetime
