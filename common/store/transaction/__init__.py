"""Transactional messages (RocketMQ's half and op records): ``hook`` turns a producer's half
message into a record of the half topic, ``records`` builds the records a transaction's end
writes, ``service`` decides each transaction once (look-ups by its origin, writes under one
lock). The check-back, which asks producers, is the master's: ``master/transaction_check.py``."""
