"""Local stand-ins for the SaaS receivers (PagerDuty, Slack) and a recording webhook receiver.

Each fake follows its vendor's documented request and response formats field for field; the
docstring of each module cites the pages it follows.
"""
