from consumer.service import Consumer
from consumer.tasks import Registry
from shared.core.states import JobState
from timer_service.service import Timer


def test_job_runs_end_to_end_in_process(client, transport, timer_settings, consumer_settings):
    seen = []
    registry = Registry()
    registry.add("hello", lambda payload, ctx: seen.append((payload, ctx.attempt)))
    job = client.schedule("hello", {"n": 1})
    timer = Timer(timer_settings, transport)
    assert timer.run_once().dispatched == 1
    consumer = Consumer(consumer_settings, registry, transport)
    consumer.open()
    assert consumer.receive_once("default", wait_seconds=5) == 1
    consumer.executor.run(consumer.pipe.work.get_nowait())
    assert consumer.complete_pending() == 1
    assert seen == [({"n": 1}, 1)]
    assert client.get(job.id).state is JobState.SUCCEEDED
    timer.close()
    consumer.close()
