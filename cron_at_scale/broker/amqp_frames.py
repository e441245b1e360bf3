"""AMQP 0-9-1 frames of Celery task messages, encoded here for a whole batch and written in one go.

py-amqp's ``basic_publish`` builds a ``Message``, encodes its properties and
headers table item by item (``amqp.serialization``: ~60 % of the publisher's
CPU per message) and writes each message with its own ``sendall``. The
messages of one task differ only in a few header values (``id``,
``root_id``, ``eta``, ``argsrepr``, ``kwargsrepr``, the ``cron_at_scale``
header), the correlation id and the body; everything else is encoded once,
with py-amqp's own encoder (``amqp.serialization.dumps``), so a constant
part is byte for byte what py-amqp writes, and only the per-message values
are encoded per message, the way py-amqp encodes them (``_write_item``: a
``str`` is a long string ``S``, an ``int`` ``I`` or ``L``, ``None`` ``V``, a
``dict`` a table ``F``). ``tests`` compare the frames with py-amqp's for the
same message.

Frames follow the AMQP 0-9-1 specification, section 4.2.3 (type, channel,
size, payload, ``0xCE``): a ``basic.publish`` method frame, a content header
frame (class 60, body size, property flags and list in the order of
``amqp.basic_message.Message.PROPERTIES``) and the body in frames of at
most ``frame_max - 8`` bytes, as py-amqp splits it.
"""

from __future__ import annotations

from collections.abc import Iterable
from struct import pack
from typing import Any

from amqp import spec
from amqp.serialization import dumps

FRAME_END = b"\xce"
BASIC = spec.Basic.CLASS_ID  # 60

# Property flags of the properties a task message carries (Message.PROPERTIES order: bit 15 first):
# content_type, content_encoding, application_headers, delivery_mode, priority, correlation_id, reply_to.
FLAGS = 0xFE00


def method_frame(channel_id: int, exchange: str, routing_key: str, mandatory: bool = True) -> bytes:
    """The whole ``basic.publish`` method frame (bytes) on channel ``channel_id``, as py-amqp writes it
    (argument signature ``Bssbb``: reserved short, exchange, routing key, mandatory, immediate)."""
    payload = pack(">HH", *spec.Basic.Publish) + dumps("Bssbb", (0, exchange, routing_key, mandatory, False))
    return pack(">BHI", 1, channel_id, len(payload)) + payload + FRAME_END


def _str(v: str) -> bytes:
    return v.encode("utf-8", "surrogatepass")


def item(v: Any) -> bytes:
    """One field-table value as py-amqp encodes it (type octet, then the value)."""
    if isinstance(v, str):
        b = _str(v)
        return b"S" + pack(">I", len(b)) + b
    if v is None:
        return b"V"
    if isinstance(v, bool):
        return pack(">cB", b"t", int(v))
    if isinstance(v, int) and -2147483647 <= v <= 2147483647:
        return pack(">ci", b"I", v)
    if isinstance(v, dict):
        return b"F" + table(v)
    # anything rarer (a long, float, Decimal, datetime, list): py-amqp's encoder on a one-item table
    return dumps("F", [{"": v}])[5:]  # drop the table's length (4 bytes) and the empty key's length (1)


def table(d: dict) -> bytes:
    """A field table (its 4-byte length, then key/value items) as py-amqp encodes it."""
    data = b"".join(key(k) + item(v) for k, v in d.items())
    return pack(">I", len(data)) + data


def key(k: str) -> bytes:
    """A field-table key: its length octet and its bytes."""
    b = _str(k)
    return pack("B", len(b)) + b


class HeadersTemplate:
    """The headers table of a message whose keys and constant values are known: the constant items
    encoded once; :meth:`encode` adds the per-message ones in their place.

    ``constant``: the headers in their order, a per-message key's value ignored; ``varying``: the keys
    whose value each message gives (in :meth:`encode`'s ``values``, in ``constant``'s order), then
    ``extra``: keys appended after them (a per-message value too).
    """

    def __init__(self, constant: dict[str, Any], varying: Iterable[str], extra: Iterable[str] = ()):
        varying = set(varying)
        self.keys: list[str] = []
        self.parts: list[bytes] = []  # constant bytes before each varying key's value, and the tail
        run = b""
        for k, v in constant.items():
            if k in varying:
                self.parts.append(run + key(k))
                self.keys.append(k)
                run = b""
            else:
                run += key(k) + item(v)
        for k in extra:
            self.parts.append(run + key(k))
            self.keys.append(k)
            run = b""
        self.parts.append(run)

    def encode(self, values: Iterable[Any]) -> bytes:
        """The table (length and items) with ``values`` for the varying keys, in :attr:`keys` order."""
        parts = self.parts
        out = [parts[0]]
        for i, v in enumerate(values, 1):
            out.append(item(v))
            out.append(parts[i])
        data = b"".join(out)
        return pack(">I", len(data)) + data


def header_frame(channel_id: int, body_size: int, content_type: str, content_encoding: str, headers: bytes,
                 delivery_mode: int, priority: int, correlation_id: str, reply_to: str) -> bytes:
    """The content header frame of a message with these properties (``headers``: an encoded table)."""
    payload = b"".join((
        pack(">HHQH", BASIC, 0, body_size, FLAGS),
        key(content_type), key(content_encoding), headers, pack("BB", delivery_mode, priority),
        key(correlation_id), key(reply_to),
    ))
    return pack(">BHI", 2, channel_id, len(payload)) + payload + FRAME_END


def body_frames(channel_id: int, body: bytes, frame_max: int) -> list[bytes]:
    """The body in frames of at most ``frame_max - 8`` payload bytes (none for an empty body)."""
    size = frame_max - 8
    if len(body) <= size:
        return [pack(">BHI", 3, channel_id, len(body)) + body + FRAME_END] if body else []
    return [pack(">BHI", 3, channel_id, len(chunk)) + chunk + FRAME_END
            for chunk in (body[i:i + size] for i in range(0, len(body), size))]
