"""The asynchronous post-training loops (paper §4.2, Figures 6–7, Appendix A.4–A.6).

RL producer (:mod:`.rl`), actor-forward and advantage stages (:mod:`.stages`), SFT
producer (:mod:`.sft`), actor consumer (:mod:`.actor`) and evaluator
(:mod:`.evaluation`) are independent asyncio tasks coupled only through the Training
Scheduler and the Training Queue; :mod:`.compile` turns workload specs into what they
need and :mod:`joynexus.runtime` hosts them.
"""
