"""kinterval.integrations"""
