"""The timer service: turns due rows into SQS messages, re-dispatches what was lost and
rescues jobs whose worker died. Any number of instances run side by side, leaderless."""

from timer_service.service import PassResult, Timer

__all__ = ["PassResult", "Timer"]
