"""MT-Bench (FastChat llm_judge): questions, answers, judge matches, results."""
