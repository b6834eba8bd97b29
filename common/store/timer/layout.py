"""The timer's on-disk formats, in RocketMQ 5's byte layout (``store/.../timer/``): a RocketMQ 5
broker's ``timerwheel``, ``timerlog/`` and ``config/timercheck`` and ours read alike. Every
integer is big-endian, as Java's ByteBuffer writes it.

``timerwheel``: ``2 * slots`` slots of 32 bytes; the slot of time t (ms) is
``t // precision % (2 * slots)``:

| off | field    | size | meaning                                                   |
|-----|----------|------|-----------------------------------------------------------|
|   0 | time     | 8    | t // precision of the tick the slot holds now             |
|   8 | firstPos | 8    | TimerLog position of the tick's first unit                |
|  16 | lastPos  | 8    | its last unit (units are linked backwards by ``prevPos``) |
|  24 | num      | 4    | units of the tick                                         |
|  28 | magic    | 4    | 0                                                         |

``timerlog/``: segments named by their start offset, of 52-byte units:

| off | field         | size | meaning                                                  |
|-----|---------------|------|----------------------------------------------------------|
|   0 | size          | 4    | 52                                                       |
|   4 | prevPos       | 8    | the tick's previous unit, -1 for its first               |
|  12 | magic         | 4    | 1 default, 2 roll (re-put, the delay was past the window), 4 delete |
|  16 | writeTimeMs   | 8    | the tick the unit was written for                        |
|  24 | delay         | 4    | the delivery time minus writeTimeMs                      |
|  28 | offsetPy      | 8    | the timer message's CommitLog offset                     |
|  36 | sizePy        | 4    | its record's size                                        |
|  40 | realTopicHash | 4    | Java hashCode of its real topic                          |
|  44 | reserved      | 8    | 0                                                        |

A segment that cannot take another unit and a 16-byte blank ends with that blank:
``length to the end:4 | 0:8 | BLANK_MAGIC:4``.

``config/timercheck``: a 4 KiB page; longs at 0 ``lastReadTimeMs`` (the next tick to
deliver), 8 ``lastTimerLogFlushPos``, 16 ``lastTimerQueueOffset`` (the timer topic's queue
offset enqueued and flushed up to), 24 ``masterTimerQueueOffset``, then the data version at 32
(state version), 40 (timestamp), 48 (counter).
"""

from __future__ import annotations

import struct

SLOT = struct.Struct(">qqqii")
SLOT_SIZE = SLOT.size
assert SLOT_SIZE == 32

UNIT = struct.Struct(">iqiqiqiiq")
UNIT_SIZE = UNIT.size
assert UNIT_SIZE == 52

MAGIC_DEFAULT = 1
MAGIC_ROLL = 1 << 1
MAGIC_DELETE = 1 << 2

# RocketMQ's TimerLog.BLANK_MAGIC_CODE: 0xBBCCDDEE ^ 1880681586 + 8, Java precedence (+ first),
# as a signed int
BLANK_MAGIC = struct.unpack(">i", struct.pack(">I", 0xBBCCDDEE ^ (1880681586 + 8)))[0]
BLANK = struct.Struct(">iqi")
MIN_BLANK = BLANK.size
assert MIN_BLANK == 16

CHECKPOINT_SIZE = 4096
CHECKPOINT = struct.Struct(">qqqqqqq")  # read time, log flush pos, queue offsets, data version
# replog's own, after RocketMQ's fields (which its reader takes alone): how many read marks
# follow, then each as (CommitLog end, read time): the read time a truncation back to that
# end goes back to (service.py, "truncation")
MARKS_COUNT = struct.Struct(">q")
MARK = struct.Struct(">qq")
MAX_SAVED_MARKS = 240
assert CHECKPOINT.size + MARKS_COUNT.size + MAX_SAVED_MARKS * MARK.size <= 4096

NO_POS = -1

