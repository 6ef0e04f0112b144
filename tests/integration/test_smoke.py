from delayq_transport import OfferOutcome


def test_offer_poll_ack(queue):
    assert queue.offer("k1", b"p") is OfferOutcome.CREATED
    env = queue.try_poll()
    assert env is not None and env.key == "k1" and not env.is_redelivery
    assert env.ack() is True
    assert queue.try_poll() is None
