"""Timer messages (RocketMQ 5's RIP-43): delivery at any time, through a TimerWheel and a
TimerLog in RocketMQ 5's byte layout. ``layout`` holds the formats, ``wheel``, ``timer_log``
and ``checkpoint`` the files, ``messages`` the properties and the put hook, ``service`` the
enqueue and dequeue threads and the flush order (see each module)."""
