"""kinterval.eval"""
