"""Answers from the database, with no trial: the best plan (verified, or from the measured trials), the
stored studies, and a study's trials with the probe's predictions beside them."""
